"""What one process's models share: torch's thread count, set in one place (threads.py), and the spans of work that
tools watch (watch.py)."""
