"""Training and evaluation of the bundled model, its drafter and the end-of-turn rule."""
