#!/usr/bin/env python
"""Error of 8-bit weights against the bf16 model, layer by layer and in the
logits, for each format (flash_dllm_jax/quantize.py).

Inputs: a batch of real prompts for a checkpoint (held-out questions of
--data, chat-rendered, followed by --gen mask tokens: what a decode step's
forward sees), or random tokens (the same share masked) for random weights
at a model's shapes (--random-shapes llada-8b). Both models run the
uncached forward in bf16; every quantized model is quantized on device from
the bf16 weights. Per layer: relative L2 error of the layer's output
hidden state (over valid positions). Logits: relative L2 error, max |error|,
and argmax agreement over all valid positions and over the masked ones.
Prints markdown tables.

  python scripts/quant_error.py --checkpoint checkpoints/synthetic-gsm-llada-16m
  python scripts/quant_error.py --random-shapes llada-8b --layers 4   # a GPU
  python scripts/quant_error.py --smoke                               # CPU, s
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from flash_dllm_jax import quantize  # noqa: E402
from flash_dllm_jax.config import ModelConfig  # noqa: E402
from flash_dllm_jax.forward import logits as forward  # noqa: E402

SHAPES = ("llada-8b", "dream-7b")
DEFAULT_CHECKPOINT = ROOT / "checkpoints" / "synthetic-gsm-llada-16m"
DEFAULT_DATA = ROOT / "data" / "synthetic_gsm" / "test.jsonl"


def prompt_batch(config, tokenizer, data: Path, n: int, gen: int):
  """(ids_BxN, valid_BxN, masked_BxN): the first n questions of a jsonl
  file, chat-rendered, left-padded, each followed by gen mask tokens."""
  from flash_dllm_jax.prompts import left_pad
  from flash_dllm_jax.prompts import token_rows
  lines = data.read_text().splitlines()[:n]
  questions = [json.loads(line)["question"] for line in lines]
  rows = token_rows(questions, tokenizer, chat=None)
  ids, valid = left_pad([r + [config.mask_token_id] * gen for r in rows],
                        config.pad_token_id, bucket=16)
  return ids, valid, ids == config.mask_token_id


def random_batch(config, n: int, length: int, gen: int, seed: int = 0):
  """Random ids [n, length], the last `gen` of each row masked."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, config.mask_token_id, (n, length), dtype=np.int32)
  ids[ids == config.eos_token_id] = 0
  ids[:, length - gen:] = config.mask_token_id
  valid = np.ones(ids.shape, bool)
  return ids, valid, ids == config.mask_token_id


def errors(ref, out, valid_BxN, masked_BxN) -> dict:
  """The metrics of one quantized forward against the reference one."""
  v, m = jnp.asarray(valid_BxN), jnp.asarray(masked_BxN & valid_BxN)
  rel = lambda a, b, w: float(
      jnp.sqrt(jnp.sum(jnp.where(w[..., None], (a - b) ** 2, 0.0)))
      / jnp.sqrt(jnp.sum(jnp.where(w[..., None], b ** 2, 0.0))))
  h_ref = ref.hidden_LxBxNxE.astype(jnp.float32)
  h_out = out.hidden_LxBxNxE.astype(jnp.float32)
  layers = [rel(h_out[i], h_ref[i], v) for i in range(h_ref.shape[0])]
  a, b = out.logits_BxNxV, ref.logits_BxNxV
  agree = a.argmax(-1) == b.argmax(-1)
  return dict(
      layers=layers, logit_rel=rel(a, b, v),
      logit_max=float(jnp.max(jnp.where(v[..., None], jnp.abs(a - b), 0.0))),
      argmax=float(jnp.sum(agree & v) / jnp.sum(v)),
      argmax_masked=(float(jnp.sum(agree & m) / jnp.sum(m))
                     if bool(jnp.any(m)) else float("nan")))


def table(results: dict, sizes: dict) -> str:
  """The two markdown tables: per format, and per layer."""
  lines = ["| format | weights MB | logits rel L2 | max abs logit error | "
           "argmax agree | argmax agree (masked) | worst layer rel L2 |",
           "|---|---|---|---|---|---|---|"]
  bf16_mb = sizes["bf16"] / 1e6
  lines.append(f"| bf16 | {bf16_mb:,.1f} | – | – | – | – | – |")
  for fmt, r in results.items():
    worst = int(np.argmax(r["layers"]))
    lines.append(
        f"| {fmt} | {sizes[fmt] / 1e6:,.1f} | {r['logit_rel']:.4f} | "
        f"{r['logit_max']:.3f} | {r['argmax']:.2%} | "
        f"{r['argmax_masked']:.2%} | {r['layers'][worst]:.4f} "
        f"(layer {worst}) |")
  fmts = list(results)
  lines += ["", "| layer | " + " | ".join(f"{f} rel L2" for f in fmts) + " |",
            "|---|" + "---|" * len(fmts)]
  for i in range(len(next(iter(results.values()))["layers"])):
    lines.append(f"| {i} | " + " | ".join(
        f"{results[f]['layers'][i]:.4f}" for f in fmts) + " |")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--checkpoint", type=Path, default=None,
                  help=f"bf16 checkpoint (default: {DEFAULT_CHECKPOINT.name})")
  ap.add_argument("--random-shapes", choices=tuple(SHAPES), default=None,
                  help="random weights at these shapes instead")
  ap.add_argument("--layers", type=int, default=None,
                  help="with --random-shapes: only the first N layers")
  ap.add_argument("--formats", nargs="+", choices=tuple(quantize.FORMATS),
                  default=list(quantize.FORMATS))
  ap.add_argument("--quantize-head", action="store_true",
                  help="quantize the LM head too")
  ap.add_argument("--quantize-embedding", action="store_true",
                  help="quantize the token embedding too (per row)")
  ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                  help="jsonl with 'question' (prompts for a checkpoint)")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--length", type=int, default=256,
                  help="tokens per row with --random-shapes")
  ap.add_argument("--gen", type=int, default=64, help="masked tokens per row")
  ap.add_argument("--smoke", action="store_true",
                  help="the shipped model, 2 prompts, gen 16 (fast on CPU)")
  args = ap.parse_args(argv)
  if args.smoke:
    args.batch, args.gen = 2, 16
  try:
    if args.random_shapes:
      if args.checkpoint is not None:
        raise ValueError("pass --checkpoint or --random-shapes, not both")
      from flash_dllm_jax.model import init_params
      config = ModelConfig.preset(args.random_shapes, dtype="bfloat16")
      if args.layers:
        config = config.replace(n_layers=args.layers)
      params = init_params(config, jax.random.key(0))
      ids, valid, masked = random_batch(config, args.batch, args.length,
                                        args.gen)
      source = f"random weights at {args.random_shapes} shapes"
    else:
      from flash_dllm_jax.checkpoint import load
      checkpoint = args.checkpoint or DEFAULT_CHECKPOINT
      params, config, tokenizer = load(checkpoint, dtype="bfloat16")
      if config.quantize is not None:
        raise ValueError(f"{checkpoint} is stored quantized; pass its bf16 "
                         "checkpoint")
      ids, valid, masked = prompt_batch(config, tokenizer, args.data,
                                        args.batch, args.gen)
      source = f"{checkpoint.name}, {args.batch} prompts of {args.data.name}"
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  run = lambda p, c: forward(p, ids, valid=valid, config=c, hidden=True,
                             precision="default")
  ref = run(params, config)
  results, sizes = {}, {"bf16": quantize.weight_bytes(params)}
  for fmt in args.formats:
    qconfig = config.replace(quantize=fmt, quantize_head=args.quantize_head,
                             quantize_embedding=args.quantize_embedding)
    qparams = quantize.quantize_params(params, qconfig)
    sizes[fmt] = quantize.weight_bytes(qparams)
    results[fmt] = errors(ref, run(qparams, qconfig), valid, masked)
    del qparams
  acts = {f: quantize.activations(f) for f in args.formats}
  print(f"{source}; {ids.shape[0]} x {ids.shape[1]} tokens "
        f"({int(masked.sum())} masked); device {jax.devices()[0].device_kind}"
        f"; activations {acts}; LM head "
        f"{'quantized' if args.quantize_head else 'bf16'}; embedding "
        f"{'quantized' if args.quantize_embedding else 'bf16'}\n")
  print(table(results, sizes))
  return 0


if __name__ == "__main__":
  sys.exit(main())
