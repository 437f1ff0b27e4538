"""The serve command's strategy and sampler variants: `--strategy`'s
default and the samplers `--variant KEY=VALUE[,...]` declares."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from flash_dllm_jax import architectures
from flash_dllm_jax.sampling.row_options import ROW_OPTIONS
from flash_dllm_jax.sampling.row_sampling import row_fields
from flash_dllm_jax.strategies import STRATEGIES, all_options, build, decodes


def default_strategy(arch: str) -> str:
  """flash-dllm (continuous batching) where it decodes `arch`, else the
  family's own strategy (what `generate` picks)."""
  if decodes(STRATEGIES["flash-dllm"], arch):
    return "flash-dllm"
  return architectures.get(arch).default_strategy


def parse_variant(spec: str, index: int) -> dict:
  """'temperature=0.7,threshold=0.8' -> {'temperature': 0.7, ...}, typed by
  the strategy registry; ValueError naming the variant and key."""
  types, out = all_options(), {}
  for item in spec.split(","):
    key, sep, value = item.strip().partition("=")
    key = key.strip().replace("-", "_")
    where = f"--variant #{index} ({spec!r})"
    if not sep or not key:
      raise ValueError(f"{where}: expected KEY=VALUE, got {item!r}")
    if key not in types:
      raise ValueError(f"{where}: unknown sampler option {key!r}")
    typ = types[key]
    try:
      if typ is bool:
        if value.lower() not in ("true", "false"):
          raise ValueError(value)
        out[key] = value.lower() == "true"
      else:
        out[key] = typ(value)
    except ValueError:
      raise ValueError(f"{where}: {key} takes a {typ.__name__}, got "
                       f"{value!r}") from None
  return out


def build_variants(strategy: str, arch: str, options: Mapping[str, Any],
                   sampler, specs: Sequence[str]) -> list:
  """The samplers of the `--variant` specs: `options` with each spec's
  changed. ValueError for a variant equal to an earlier sampler or one
  that changes only row data (per-request settings)."""
  variants = [build(strategy, arch, {**options, **parse_variant(v, i + 1)})[0]
              for i, v in enumerate(specs)]
  for i, v in enumerate(variants):
    if v in [sampler, *variants[:i]]:
      raise ValueError(f"--variant #{i + 1} ({specs[i]!r}) decodes "
                       "with the same options as an earlier sampler")
    changed = {k for k in vars(sampler) if getattr(v, k) != getattr(
        sampler, k)}
    if changed <= set(row_fields(sampler)):
      fields = ", ".join(f"decoding.{k}" if k in ROW_OPTIONS
                         else f"the request's {k}" for k in sorted(changed))
      raise ValueError(
          f"--variant #{i + 1} ({specs[i]!r}): "
          f"{', '.join(sorted(changed))} is a per-request setting "
          f"({fields}); --variant is for options that change the "
          "compiled program")
  return variants
