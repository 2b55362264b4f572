"""The bundled model: the block-diffusion network over SmolLM2-135M-Instruct, its adapter I/O, its loading, and its
weights and model card (default/)."""
