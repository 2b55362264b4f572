"""Think: the final transcript in, the answer's drafts out (the dialogue's history and the diffusion LM's run)."""
