"""The one dispatch point between model code and `pallas_kernels`.

Model code calls these functions and never imports a kernel. Each picks a
Pallas kernel where one exists for the backend and the shape measured faster
(BENCHMARKS.md, "Kernels") or where its fixed summation order keeps a row's
bits independent of batch and mesh, and the plain-JAX reference otherwise.

`implementation`: None chooses by backend (Pallas on a GPU, reference
elsewhere); 'reference', 'pallas' or 'pallas_interpret' (the kernel run by
the Pallas interpreter, how CPU tests exercise the kernel path) force one;
a `Kernels` adds kernel settings to that choice.
"""

from flash_dllm_jax.ops.attention import (BlockCausal, attention,
                                          cached_attention,
                                          rope_and_write, rope_and_write_8bit,
                                          write_cache)
from flash_dllm_jax.ops.choice import (ExpertTiling, Kernels, Tiling,
                                       default_tiling)
from flash_dllm_jax.ops.experts import routed_experts
from flash_dllm_jax.ops.linear import (QMATMUL_STREAM_MAX_Q,
                                       QMATMUL_W8A8_STREAM_MAX_Q, linear,
                                       quantized_linear, stream_max_q)
from flash_dllm_jax.ops.rows import rms_norm, token_logprob

__all__ = ["BlockCausal", "ExpertTiling", "Kernels", "QMATMUL_STREAM_MAX_Q",
           "QMATMUL_W8A8_STREAM_MAX_Q", "attention", "cached_attention",
           "default_tiling",
           "linear", "quantized_linear", "rms_norm", "rope_and_write",
           "rope_and_write_8bit",
           "routed_experts", "stream_max_q", "Tiling", "token_logprob",
           "write_cache"]
