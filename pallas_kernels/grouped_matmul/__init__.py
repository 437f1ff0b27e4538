"""Grouped GEMM over expert-sorted rows (one expert per row tile), with a
fused SwiGLU gate/up variant, for the routed experts of an MoE layer."""
