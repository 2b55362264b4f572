"""What one process's models share: thread counts, set in one place (threads.py), the cores (cpu_budget.py: what each
kind of work holds, the wider teams granted), and the spans of work that tools watch (watch.py)."""
