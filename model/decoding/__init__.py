"""Decoding policies: the threshold diffusion sampler, self-speculative and autoregressive decoding, the speech
guard, the draft policy, and the `Denoiser` protocol and `Refinement` they share."""
