"""Benchmarks: scripts run by hand (``.venv/bin/python bench/<name>.py``), never timed tests."""
