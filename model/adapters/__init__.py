"""Adapters that turn checkpoints (masked LMs, remote-code LLaDA-style models, DiffusionGemma) into the sampler's
`Denoiser` interface or, for models that are not masked, into a stream of `Refinement`s."""
