"""Training of the bundled model's adapter: the block-diffusion loss and the teacher's answers it learns from."""
