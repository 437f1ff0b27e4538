"""`--model_args` of the lm-eval model: the adapter's own settings plus the
chosen strategy's sampler options (flash_dllm_jax/strategies.py).

lm-eval splits model_args at commas and turns "true"/"32"/"0.9" into
bool/int/float; here values are checked against the adapter's fields and
the sampler's annotations, and every problem is reported in one error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from flash_dllm_jax.strategies import STRATEGIES, all_options, sampler_options

_PREFIX = "bad model_args for flash_dllm_jax: "
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HF models' default when a task sets none


@dataclasses.dataclass(frozen=True)
class AdapterArgs:
  """checkpoint: converted checkpoint directory. strategy: a name from
  STRATEGIES (default: the checkpoint's reference sampler). batch_size:
  rows per decode (slots, for strategies with continuous batching) and
  copies per likelihood forward. chat: wrap each context as one user turn of
  the checkpoint's chat template. mesh: 'data=D', 'model=M' or
  'data=D;model=M' (';' since model_args are split at commas). seed: row i
  of a call uses seed + i. mc_num, cfg, sampling_eps: the Monte-Carlo
  likelihood (likelihood.py). dtype: compute dtype (default: the
  checkpoint's)."""

  checkpoint: str
  strategy: str | None = None
  batch_size: int = 1
  chat: bool = False
  mesh: str | None = None
  dtype: str | None = None
  seed: int = 0
  mc_num: int = 128
  cfg: float = 0.0
  sampling_eps: float = 1e-3
  stop_at_eos: bool = True
  max_gen_toks: int = DEFAULT_MAX_GEN_TOKS

  def __post_init__(self):
    errors = []
    if not Path(self.checkpoint).is_dir():
      errors.append(f"checkpoint={self.checkpoint!r} is not a directory")
    if self.strategy is not None and self.strategy not in STRATEGIES:
      errors.append(f"strategy={self.strategy!r} is unknown; known: "
                    f"{', '.join(STRATEGIES)}")
    for name in ("batch_size", "mc_num", "max_gen_toks"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        errors.append(f"{name} must be a positive int, got {value!r}")
    if not errors and self.mc_num % self.batch_size:
      errors.append(f"mc_num ({self.mc_num}) must be a multiple of batch_size "
                    f"({self.batch_size}): each likelihood forward holds "
                    "batch_size stratified mask ratios")
    if self.cfg < 0:
      errors.append(f"cfg must be >= 0, got {self.cfg}")
    if not 0 <= self.sampling_eps < 1:
      errors.append(f"sampling_eps must be in [0, 1), got {self.sampling_eps}")
    if self.dtype not in (None, "bfloat16", "float32"):
      errors.append(f"dtype must be bfloat16 or float32, got {self.dtype!r}")
    if errors:
      raise ValueError(_PREFIX + "; ".join(errors))

  @property
  def mesh_spec(self) -> str | None:
    """The mesh in parallel.parse_mesh's syntax."""
    return None if self.mesh is None else self.mesh.replace(";", ",")


# lm-eval's own keywords (batch_size/device/max_batch_size come from its CLI
# flags; trust_remote_code from --trust_remote_code): accepted, and all but
# batch_size unused (JAX places arrays itself; mesh= picks devices).
IGNORED = ("device", "max_batch_size", "trust_remote_code")


def _coerce(name: str, value: Any, typ: type) -> Any:
  if typ is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if typ is str and value is not None and not isinstance(value, str):
    return str(value)
  if value is not None and not (isinstance(value, typ)
                                and (typ is bool or not isinstance(value, bool))):
    raise TypeError(f"{name}={value!r} should be {typ.__name__}")
  return value


def parse(kwargs: Mapping[str, Any]) -> tuple[AdapterArgs, dict[str, Any]]:
  """(adapter settings, sampler options) from the model_args keywords."""
  types = {k: t for k, (t, _) in sampler_options(AdapterArgs).items()}
  sampler_types = all_options()
  mine, options, errors = {}, {}, []
  for key, value in kwargs.items():
    if key in IGNORED:
      continue
    typ = types.get(key) or sampler_types.get(key)
    if typ is None:
      hint = (" (model_args are split at commas: write mesh=data=2;model=2)"
              if key == "model" else "")
      errors.append(f"unknown model_arg {key!r}{hint}")
      continue
    try:
      value = _coerce(key, value, typ)
    except TypeError as e:
      errors.append(str(e))
      continue
    (mine if key in types else options)[key] = value
  adapter = None
  if "checkpoint" not in mine:
    errors.append("checkpoint=DIR is required")
  else:
    try:
      adapter = AdapterArgs(**mine)
    except ValueError as e:
      errors.append(str(e).removeprefix(_PREFIX))
  if errors:
    raise ValueError(_PREFIX + "; ".join(errors) + f". Adapter keys: {', '.join(types)}; sampler options "
                     "depend on strategy= (see flash_dllm_jax/strategies.py)")
  return adapter, options
