"""The fast decode path: a compact Llama over the model's weights, its torch spec and Triton kernels."""
