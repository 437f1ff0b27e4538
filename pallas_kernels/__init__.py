"""Pallas GPU kernels for diffusion-LM decoding, each with a plain-JAX reference.

One folder per op: `reference.py` is the plain-JAX definition that tests and
non-GPU backends use; kernels live beside it. This package never imports
`flash_dllm_jax`: the model reaches it through `flash_dllm_jax.ops`.
"""
