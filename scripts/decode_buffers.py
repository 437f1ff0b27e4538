"""The buffers of a compiled decode, without running it (any backend).

Compiles (abstract inputs, nothing allocated) one strategy's decode at a
preset's shapes with fewer layers, and prints XLA's memory analysis
(temporary and argument bytes) and the largest arrays of the optimized
HLO, each with its op's source: where a long prompt's or a large batch's
memory goes. On a CPU the attention is the plain-JAX reference (float32
scores per query chunk), on a GPU the GPU program's.

  python scripts/decode_buffers.py --preset llada2-mini --layers 2 \\
      --strategy llada2 --batch 8 --prompt 32768 --gen 512
  python scripts/decode_buffers.py --smoke
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax.generate import decode_jit  # noqa: E402
from flash_dllm_jax.model import init_params  # noqa: E402
from flash_dllm_jax.strategies import build_sampler  # noqa: E402

ARRAY = re.compile(r"\s*(?:ROOT )?%[\w.\-]+ = (\w+)\[([\d,]*)\]")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def largest_arrays(hlo: str, top: int) -> list[dict]:
  """The `top` largest distinct (shape, op) arrays an HLO text defines."""
  seen = {}
  for line in hlo.splitlines():
    m = ARRAY.match(line)
    if not m or m.group(1) not in _BYTES:
      continue
    dims = [int(d) for d in m.group(2).split(",") if d]
    op = OP_NAME.search(line)
    key = (m.group(1), tuple(dims), op.group(1) if op else "")
    seen[key] = math.prod(dims) * _BYTES[m.group(1)]
  rows = sorted(seen.items(), key=lambda kv: -kv[1])[:top]
  return [dict(dtype=d, shape=list(s), op=o, bytes=b)
          for (d, s, o), b in rows]


_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1,
          "s8": 1, "u8": 1, "f8e4m3fn": 1}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="llada2-mini")
  ap.add_argument("--layers", type=int, default=2,
                  help="layers kept (the first dense one and an MoE one "
                  "for LLaDA2)")
  ap.add_argument("--strategy", default="llada2")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--prompt", type=int, default=32768)
  ap.add_argument("--gen", type=int, default=512)
  ap.add_argument("--top", type=int, default=12)
  ap.add_argument("--smoke", action="store_true",
                  help="the tiny LLaDA2 at batch 2, prompt 64, gen 16")
  ap.add_argument("--json", type=Path, default=None)
  args = ap.parse_args(argv)
  if args.smoke:
    cfg = ModelConfig.tiny("llada2")
    args.batch, args.prompt, args.gen = 2, 64, 16
  else:
    cfg = ModelConfig.preset(args.preset, n_layers=args.layers)
  sampler = build_sampler(args.strategy, cfg.arch, dict(gen_length=args.gen))
  cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, args.prompt + args.gen
                                    + sampler.tail_length))
  b, spec = args.batch, jax.ShapeDtypeStruct
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  rng = jax.eval_shape(
      lambda: jax.vmap(jax.random.key)(jnp.arange(b, dtype=jnp.uint32)))
  compiled = decode_jit.lower(
      params, spec((b, args.prompt), jnp.int32),
      spec((b, args.prompt), bool), rng, None, config=cfg, sampler=sampler,
      stop_at_eos=False).compile()
  mem = compiled.memory_analysis()
  out = dict(backend=jax.default_backend(), batch=b, prompt=args.prompt,
             gen=args.gen, layers=cfg.n_layers,
             temp_bytes=mem.temp_size_in_bytes,
             argument_bytes=mem.argument_size_in_bytes,
             arrays=largest_arrays(compiled.as_text(), args.top))
  print(f"{args.strategy} decode, {cfg.n_layers} layers, batch {b}, prompt "
        f"{args.prompt}, gen {args.gen} on {out['backend']}: temporaries "
        f"{out['temp_bytes'] / 2**30:.2f} GiB, arguments "
        f"{out['argument_bytes'] / 2**30:.2f} GiB")
  for a in out["arrays"]:
    print(f"{a['bytes'] / 2**30:9.3f} GiB  {a['dtype']}{a['shape']}  "
          f"{a['op'][-90:]}")
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
  return out


if __name__ == "__main__":
  main()
