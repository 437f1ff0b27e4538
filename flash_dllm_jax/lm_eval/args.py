"""`--model_args` of the lm-eval model: the adapter's own settings plus the
chosen strategy's sampler options (flash_dllm_jax/strategies.py).

lm-eval splits model_args at commas and turns "true"/"32"/"0.9" into
bool/int/float; here values are checked against the adapter's fields and
the sampler's annotations, and every problem is reported in one error
(ModelArgsError). `pretrained=DIR` (lm-eval's and vLLM's name) and
`checkpoint=DIR` are the same key. batch_size takes lm-eval's own forms
too: an int, its string ("8" from `--batch_size 8`), or "auto"/"auto:N".
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Mapping

from flash_dllm_jax.strategies import (STRATEGIES, all_options,
                                      renamed_error, sampler_options)

_PREFIX = "bad model_args for flash_dllm_jax: "
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HF models' default when a task sets none
# batch_size=auto: the reference adapters' batch (at most --max_batch_size).
AUTO_BATCH_SIZE = 32
# mc_group default: LLaDA's get_log_likelihood stratifies 128 copies in
# batches of 32.
DEFAULT_MC_GROUP = 32
SEED_LIMIT = 2 ** 32  # seeds are uint32 PRNG keys


class ModelArgsError(ValueError):
  """Every problem with one model_args, in one message."""


@dataclasses.dataclass(frozen=True)
class AdapterArgs:
  """checkpoint: converted checkpoint directory (model_arg pretrained= or
  checkpoint=). strategy: a name from STRATEGIES (default: the checkpoint's
  reference sampler). batch_size: rows per decode (slots, for strategies
  with continuous batching) and noisy copies per likelihood forward. chat:
  wrap each context as one user turn of the checkpoint's chat template.
  mesh: 'data=D', 'model=M' or 'data=D;model=M' (';' since model_args are
  split at commas). seed: row i of a call uses seed + i, in [0, 2**32).
  mc_num, mc_group (copies per stratified draw; default min(32, mc_num)),
  cfg, sampling_eps: the Monte-Carlo likelihood (likelihood.py); scores
  depend on them and the seed, never on batch_size. dtype: compute dtype
  (default: the checkpoint's). memory_gib: the memory a batch may use
  (default: the device's free memory; memory.py clips batch_size to it)."""

  checkpoint: str
  strategy: str | None = None
  batch_size: int = 1
  chat: bool = False
  mesh: str | None = None
  dtype: str | None = None
  seed: int = 0
  mc_num: int = 128
  mc_group: int | None = None
  cfg: float = 0.0
  sampling_eps: float = 1e-3
  stop_at_eos: bool = True
  max_gen_toks: int = DEFAULT_MAX_GEN_TOKS
  memory_gib: float | None = None

  def __post_init__(self):
    errors = []
    if not self.checkpoint.strip():
      errors.append("pretrained= (checkpoint=) is empty")
    elif not Path(self.checkpoint).is_dir():
      what = "is a file, not" if Path(self.checkpoint).exists() else "is not"
      errors.append(f"checkpoint={self.checkpoint!r} {what} a directory")
    if self.strategy is not None and self.strategy not in STRATEGIES:
      errors.append(f"strategy={self.strategy!r} is unknown; known: "
                    f"{', '.join(STRATEGIES)}")
    for name in ("batch_size", "mc_num", "mc_group", "max_gen_toks"):
      value = getattr(self, name)
      if value is None and name == "mc_group":
        continue
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        errors.append(f"{name} must be a positive int, got {value!r}")
    if not errors and self.mc_num % self.group:
      errors.append(f"mc_num ({self.mc_num}) must be a multiple of mc_group "
                    f"({self.group}): each group of mc_group copies shares "
                    "one stratified draw of mask ratios")
    if not 0 <= self.seed < SEED_LIMIT:
      errors.append(f"seed must be in [0, 2**32), got {self.seed}")
    if not (math.isfinite(self.cfg) and self.cfg >= 0):
      errors.append(f"cfg must be a finite number >= 0, got {self.cfg}")
    if not 0 <= self.sampling_eps < 1:
      errors.append(f"sampling_eps must be in [0, 1), got {self.sampling_eps}")
    if self.memory_gib is not None and not (
        math.isfinite(self.memory_gib) and self.memory_gib > 0):
      errors.append(f"memory_gib must be a finite number > 0, got "
                    f"{self.memory_gib}")
    if self.dtype not in (None, "bfloat16", "float32"):
      errors.append(f"dtype must be bfloat16 or float32, got {self.dtype!r}")
    if errors:
      raise ModelArgsError(_PREFIX + "; ".join(errors))

  @property
  def group(self) -> int:
    """Copies per stratified draw (mc_group, default min(32, mc_num))."""
    return self.mc_group or min(DEFAULT_MC_GROUP, self.mc_num)

  @property
  def mesh_spec(self) -> str | None:
    """The mesh in parallel.parse_mesh's syntax."""
    return None if self.mesh is None else self.mesh.replace(";", ",")


# lm-eval's own keywords (batch_size/device/max_batch_size come from its CLI
# flags; trust_remote_code from --trust_remote_code): accepted, and all but
# batch_size and max_batch_size (which caps batch_size=auto) unused (JAX
# places arrays itself; mesh= picks devices).
IGNORED = ("device", "trust_remote_code")
ALIASES = {"pretrained": "checkpoint"}


def _coerce(name: str, value: Any, typ: type) -> Any:
  if typ is int and isinstance(value, float) and value.is_integer():
    return int(value)  # lm-eval reads "-1" as -1.0 (it isnumeric() only 0-9)
  if typ is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if typ is str and value is not None and not isinstance(value, str):
    return str(value)
  if value is not None and not (isinstance(value, typ)
                                and (typ is bool or not isinstance(value, bool))):
    raise TypeError(f"{name}={value!r} should be {typ.__name__}")
  return value


def batch_size_value(value: Any, max_batch_size: Any = None) -> Any:
  """lm-eval's batch_size forms as an int: 8, "8", or "auto" / "auto:N"
  (AUTO_BATCH_SIZE, at most max_batch_size); anything else as given, for
  AdapterArgs to refuse."""
  if isinstance(value, str):
    text = value.strip().lower()
    if text.isdigit():
      return int(text)
    if re.fullmatch(r"auto(:\d+)?", text):
      cap = max_batch_size if isinstance(max_batch_size, int) and not \
          isinstance(max_batch_size, bool) and max_batch_size > 0 else None
      return min(AUTO_BATCH_SIZE, cap or AUTO_BATCH_SIZE)
  return value


def parse(kwargs: Mapping[str, Any]) -> tuple[AdapterArgs, dict[str, Any]]:
  """(adapter settings, sampler options) from the model_args keywords."""
  types = {k: t for k, (t, _) in sampler_options(AdapterArgs).items()}
  sampler_types = all_options()
  mine, options, errors = {}, {}, []
  given = [k for k in ("pretrained", "checkpoint") if k in kwargs]
  if len(given) == 2 and kwargs["pretrained"] != kwargs["checkpoint"]:
    errors.append(f"pretrained={kwargs['pretrained']!r} and checkpoint="
                  f"{kwargs['checkpoint']!r} name two checkpoints (they are "
                  "one key: give one)")
  for key, value in kwargs.items():
    if key in IGNORED or key == "max_batch_size":
      continue
    key = ALIASES.get(key, key)
    if key == "batch_size":
      value = batch_size_value(value, kwargs.get("max_batch_size"))
      if isinstance(value, str):
        errors.append("batch_size must be a positive int, auto or auto:N, "
                      f"got {value!r}")
        continue
    typ = types.get(key) or sampler_types.get(key)
    if typ is None and (why := renamed_error(key, flag=False)):
      errors.append(why)
      continue
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
    errors.append("pretrained=DIR (or checkpoint=DIR) is required")
  else:
    try:
      adapter = AdapterArgs(**mine)
    except ModelArgsError as e:
      errors.append(str(e).removeprefix(_PREFIX))
  if errors:
    raise ModelArgsError(
        _PREFIX + "; ".join(errors) + f". Adapter keys: pretrained, "
        f"{', '.join(types)}; sampler options depend on strategy= (see "
        "flash_dllm_jax/strategies.py)")
  return adapter, options
