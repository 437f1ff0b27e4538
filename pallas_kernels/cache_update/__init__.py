"""KV-cache writes: scatter (reference) and fused RoPE + in-place write."""
