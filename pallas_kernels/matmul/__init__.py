"""Weight-streaming matmul for few rows, with SwiGLU and residual epilogues."""
