"""The drafter: a small block-diffusion model on the target's own hidden states (drafter.py), one answer's
drafting state (context.py), how it learns (training.py)."""
