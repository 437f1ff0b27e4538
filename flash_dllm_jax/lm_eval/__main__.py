"""`python -m flash_dllm_jax.lm_eval ARGS`: lm-eval's own CLI (`lm_eval
ARGS`) with the model `flash_dllm_jax` registered and, unless ARGS name one,
`--include_path` set to the shipped task configs. (lm-eval 0.4 finds models
only in its own table or among classes already imported: it loads no entry
points or plugins, so the plain `lm_eval` command cannot see this one.)

A `checkpoint=` key of --model_args is handed to lm-eval as `pretrained=`,
the key lm-eval names output folders after (`OUT/<checkpoint path with /
as __>/results_<date>.json`). Bad model_args end the run with one error
line.

With --output_path, the adapter's throughput (stats.py) is also written as
throughput_<date>.json beside the results_<date>.json lm-eval wrote (the
same numbers are in that file's config.flash_dllm_jax). Compiled decode
loops go to the CLI's persistent compilation cache
($FLASH_DLLM_JAX_CACHE_DIR, off to turn it off).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from flash_dllm_jax import compilation
from flash_dllm_jax.lm_eval import TASKS_DIR, model
from flash_dllm_jax.lm_eval.args import ModelArgsError

_COMMANDS = ("run", "ls", "validate")


def _output_path(argv: list[str]) -> Path | None:
  for i, arg in enumerate(argv):
    if arg in ("--output_path", "-o") and i + 1 < len(argv):
      return Path(argv[i + 1])
    if arg.startswith("--output_path="):
      return Path(arg.split("=", 1)[1])
  return None


_CHECKPOINT_KEY = re.compile(r"(^|,)\s*checkpoint=")


def _as_pretrained(value: str) -> str:
  """One --model_args value with its checkpoint= key as pretrained= (a JSON
  object's key too)."""
  try:
    obj = json.loads(value)
  except ValueError:
    obj = None
  if isinstance(obj, dict):
    if "checkpoint" in obj and "pretrained" not in obj:
      obj["pretrained"] = obj.pop("checkpoint")
    return json.dumps(obj)
  return _CHECKPOINT_KEY.sub(r"\1pretrained=", value)


def model_args_as_pretrained(argv: list[str]) -> list[str]:
  """argv with checkpoint= written pretrained= in every --model_args / -a
  value (lm-eval takes several values after the flag)."""
  if any(re.search(r"(^|,)\s*pretrained=|\"pretrained\"", a) for a in argv):
    return list(argv)  # both keys: parse() reports a conflict
  out, in_args = [], False
  for arg in argv:
    if arg.startswith("--model_args="):
      out.append("--model_args=" + _as_pretrained(arg.split("=", 1)[1]))
      in_args = False
      continue
    if in_args and not arg.startswith("-"):
      arg = _as_pretrained(arg)
    else:
      in_args = arg in ("--model_args", "-a")
    out.append(arg)
  return out


def _write_throughput(out: Path, seen: set[Path]) -> None:
  """Beside each results file this run added under `out`."""
  root = out.parent if out.suffix == ".json" else out
  for results in sorted(set(root.rglob("results_*.json")) - seen):
    stamp = results.stem.removeprefix("results_")
    info = json.loads(results.read_text())["config"].get("flash_dllm_jax")
    if info is not None:
      path = results.with_name(f"throughput_{stamp}.json")
      path.write_text(json.dumps(info, indent=2) + "\n")
      print(f"throughput: {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] not in _COMMANDS and argv[0] not in ("-h", "--help"):
    argv = ["run", *argv]
  if argv and argv[0] in ("run", "ls") and not any(
      a == "--include_path" or a.startswith("--include_path=") for a in argv):
    argv[1:1] = ["--include_path", str(TASKS_DIR)]
  out = _output_path(argv)
  root = None if out is None else (out.parent if out.suffix == ".json" else out)
  seen = set(root.rglob("results_*.json")) if root and root.exists() else set()
  from lm_eval.__main__ import cli_evaluate
  try:
    compilation.enable_persistent_cache(compilation.default_cache_dir())
  except ValueError as e:  # a cache directory that cannot be created
    sys.exit(f"error: {e}")
  sys.argv = ["python -m flash_dllm_jax.lm_eval",
              *model_args_as_pretrained(argv)]
  try:
    cli_evaluate()
  except ModelArgsError as e:
    sys.exit(f"error: {e}")
  if out is not None and model.INSTANCES:
    _write_throughput(out, seen)


if __name__ == "__main__":
  main()
