"""A kernel choice with settings (`Kernels`) and how ops read one."""

from __future__ import annotations

import argparse
import dataclasses

import jax

from pallas_kernels.attention import api as attention_api
from pallas_kernels.common import resolve_implementation
from pallas_kernels.grouped_matmul.tiling import Tiling as ExpertTiling

Tiling = attention_api.Tiling  # the attention kernel's tiling rules


@dataclasses.dataclass(frozen=True)
class Kernels:
  """A kernel choice with settings, accepted wherever `implementation` is:
  name as `implementation` (None: by backend), the attention kernel's
  tiling rules (default_tiling: the automatic split), the grouped expert
  kernel's (`routed_experts`; None runs every expert on every row, the
  differentiable path training takes, as the kernel has no VJP) and the
  rows per sequence up to which 8-bit weights stream (`quantized_linear`;
  benchmarks sweep them; static, so part of the jit key), and the backend
  that streams them on a GPU (`qmatmul`: "triton", the default, or
  "mosaic", Mosaic GPU's kernel, which no measurement chooses yet);
  likewise `cache_update`, the backend of the fused RoPE + cache write,
  `attention_backend`, the cached attention's, and `experts_backend`, the
  grouped expert GEMM's (Mosaic GPU's picks its own row tiles; `experts`
  then tiles only what falls through to Triton). `block_attention`: how
  a block-causal family's attention runs under the kernel names: "split"
  (the scheduled kernel decode block by decode block, ops/block_attention.py)
  or "fused" (JAX's fused attention on a GPU, the reference elsewhere);
  None (the default): "split" on a GPU ('pallas', where it measures
  faster), "fused" under 'pallas_interpret'."""

  name: str | None = None
  attention: attention_api.Tiling = dataclasses.field(
      default_factory=lambda: default_tiling())
  experts: ExpertTiling | None = ExpertTiling()
  stream_max_q: int | None = None  # default: ops.stream_max_q(format)
  qmatmul: str = "triton"
  cache_update: str = "triton"
  attention_backend: str = "triton"
  experts_backend: str = "triton"
  block_attention: str | None = None

  def __post_init__(self):
    if self.stream_max_q is not None and self.stream_max_q < 0:
      raise ValueError(f"stream_max_q must be >= 0, got {self.stream_max_q}")
    for name in ("qmatmul", "cache_update", "attention_backend",
                 "experts_backend"):
      if getattr(self, name) not in GPU_BACKENDS:
        raise ValueError(f"{name} must be one of {GPU_BACKENDS}, got "
                         f"{getattr(self, name)!r}")
    if self.block_attention not in (None, *BLOCK_ATTENTIONS):
      raise ValueError(f"block_attention must be one of {BLOCK_ATTENTIONS}, "
                       f"got {self.block_attention!r}")


GPU_BACKENDS = ("triton", "mosaic")  # Pallas lowerings on a GPU
BLOCK_ATTENTIONS = ("fused", "split")  # Kernels.block_attention


def block_attention(implementation) -> str:
  """Kernels.block_attention of `implementation`; unset (or a name alone):
  "split" on a GPU ('pallas'), "fused" elsewhere."""
  choice = getattr(implementation, "block_attention", None)
  if choice is None:
    return "split" if kernel_name(implementation) == "pallas" else "fused"
  return choice


def kernel_name(implementation: "str | Kernels | None") -> str:
  if isinstance(implementation, Kernels):
    implementation = implementation.name
  return resolve_implementation(implementation)


def backend_name(implementation, op: str) -> str:
  """The kernel name `op` (a Kernels field naming a GPU backend) runs as:
  kernel_name's, with 'pallas' made 'mosaic' where Kernels asks for
  Mosaic GPU (its api falls through to the Triton kernel)."""
  impl = kernel_name(implementation)
  if impl.startswith("pallas") and getattr(implementation, op,
                                           "triton") == "mosaic":
    return impl.replace("pallas", "mosaic")
  return impl


def tiling(implementation) -> attention_api.Tiling:
  if isinstance(implementation, Kernels):
    return implementation.attention
  return default_tiling()


def default_tiling() -> attention_api.Tiling:
  """The attention tiling every entry point decodes with unless told: the
  automatic split (split_rule("auto")) for this device. At batch 1 it is
  the faster tiling, at batch 32 within a few percent of split_target=32
  (BENCHMARKS.md, "Hopper kernels"); a split rule may not follow the batch
  size, so one rule serves both."""
  return attention_api.Tiling(**split_rule("auto"))


def expert_tiling(implementation) -> ExpertTiling | None:
  if isinstance(implementation, Kernels):
    return implementation.experts
  return ExpertTiling()


def parse_split_target(text):
  """--attention-split-target's value: an int, or "auto"."""
  if text == "auto":
    return text
  try:
    return int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"expected an int or 'auto', got {text!r}") from None


def add_flags(parser) -> None:
  """--attention-split-target N|auto on an argparse parser
  (kernels_from_args)."""
  parser.add_argument(
      "--attention-split-target", type=parse_split_target, default=None,
      metavar="N|auto",
      help="attention programs a sequence fills before its keys are split; "
      "auto (the default): the device's SM count, with at most twice that "
      "many programs a call, a batch's rows running their splits in fewer "
      "programs (the same bits for any batch size); 32 never splits "
      "LLaDA-8B's keys, a little faster at batch 32 and slower at batch 1")


def device_sm_count(default: int = 132) -> int:
  """Streaming multiprocessors of the first device (`default` where the
  device does not tell, as on a CPU)."""
  return getattr(jax.devices()[0], "core_count", None) or default


def split_rule(value) -> dict:
  """The Tiling fields --attention-split-target `value` sets: none for
  None, split_target for an int (each split in its own program), and for
  "auto" split_target = the SM count with group_target = twice it
  (tiling.split_group_for)."""
  if value is None:
    return {}
  if value == "auto":
    sms = device_sm_count()
    return dict(split_target=sms, group_target=2 * sms)
  return dict(split_target=value, group_target=None)


def kernels_from_args(args) -> Kernels | None:
  """The Kernels the add_flags flags ask for (None: the defaults,
  default_tiling's)."""
  fields = split_rule(args.attention_split_target)
  if not fields:
    return None
  try:
    tiling = Tiling(**fields)
  except ValueError as e:
    raise ValueError(f"--attention-split-target: {e}") from None
  return Kernels(attention=tiling)
