"""Alert rules, evaluation and notifications (the Alerts issue builds them)."""
