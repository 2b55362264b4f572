"""The pass runtime: the batch runner (the loop that runs every answer), batched passes over a slot KV cache, the
fused pass and its row-exact kernels, the pass layout of noisy rows, and the thread the passes run on."""
