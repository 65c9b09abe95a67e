"""The real engine: a Llama-style model on our kernels, driven by the shared core."""
