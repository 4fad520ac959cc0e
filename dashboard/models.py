"""The dashboard keeps no tables of its own: the price table moved to analytics.models."""
