#!/usr/bin/env python
"""Does XLA:CPU give the same forward in every iteration of a while loop
under a mesh of forced host devices?

  XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
      python tools/probe_cpu_loop_collectives.py --batch 58 --iters 6

One compiled `lax.while_loop` runs the shipped model's uncached forward
(SequenceModel.logits, the LLaDA sampler's forward) --iters times on the
SAME input, the first --batch held-out prompts of one prompt-length bucket
followed by gen-length masks, and stores each iteration's argmax tokens.
The same program runs on one device and under --mesh. A correct runtime
gives identical rows in every iteration. Printed per iteration: the rows
whose argmax differs from one device's, and whether each run agrees with
its own first iteration. What it finds on a 2-core host is in BENCHMARKS.md
("Multi-GPU"): a runtime fault of XLA:CPU's in-process collectives, not a
sharding or rounding effect.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from flash_dllm_jax import checkpoint, parallel  # noqa: E402
from flash_dllm_jax.cli import DEFAULT_CHECKPOINT  # noqa: E402
from flash_dllm_jax.eval.tasks import make_render  # noqa: E402
from flash_dllm_jax.eval.tasks.gsm8k import GSM8K  # noqa: E402
from flash_dllm_jax.generate import CPU_COMPILER_OPTIONS  # noqa: E402
from flash_dllm_jax.prompts import bucket_groups, left_pad  # noqa: E402
from flash_dllm_jax.sampling.sequence_model import SequenceModel  # noqa: E402


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batch", type=int, default=58)
  ap.add_argument("--iters", type=int, default=6)
  ap.add_argument("--first", type=int, default=64,
                  help="the rows: the first FIRST problems' bucket --bucket")
  ap.add_argument("--bucket", type=int, default=1)
  ap.add_argument("--gen-length", type=int, default=128)
  ap.add_argument("--mesh", default="model=2")
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
  ap.add_argument("--data", type=Path, default=ROOT / "data/synthetic_gsm")
  args = ap.parse_args()
  params, config, tok = checkpoint.load(args.checkpoint)
  problems = GSM8K(args.data, num_fewshot=0, chat=True).problems(
      make_render(tok, True))
  rows = [tok.encode(p.prompt) for p in problems[:args.first]]
  group = bucket_groups(rows)[args.bucket][:args.batch]
  ids, valid = left_pad([rows[i] for i in group], config.pad_token_id)
  b, p = ids.shape
  g, k = args.gen_length, args.iters
  tokens_BxN = jnp.asarray(np.concatenate(
      [ids, np.full((b, g), config.mask_token_id, np.int32)], 1))
  valid_BxN = jnp.asarray(np.concatenate([valid, np.ones((b, g), bool)], 1))
  rows_BxR = jnp.asarray(np.broadcast_to(np.arange(p, p + g), (b, g)))

  def forward_loop(params, tokens_BxN, valid_BxN, rows_BxR):
    model = SequenceModel.for_batch(config, params, valid_BxN)

    # The input is indexed by the loop counter, as a decode's state is.
    tokens_KxBxN = jnp.broadcast_to(tokens_BxN, (k, *tokens_BxN.shape))

    def body(carry):
      i, out_KxBxR = carry
      logits = model.logits(tokens_KxBxN[i], rows_BxR)
      return i + 1, out_KxBxR.at[i].set(jnp.argmax(logits, -1).astype(
          jnp.int32))
    out = jnp.zeros((k, b, g), jnp.int32)
    return jax.lax.while_loop(lambda c: c[0] < k, body, (0, out))[1]

  run = jax.jit(forward_loop, compiler_options=CPU_COMPILER_OPTIONS)
  one = np.asarray(run(params, tokens_BxN, valid_BxN, rows_BxR))
  mesh = parallel.parse_mesh(args.mesh)
  with parallel.use(mesh):
    sharded = np.asarray(run(
        parallel.shard_params(mesh, config, params),
        *(parallel.shard_rows(mesh, a)
          for a in (tokens_BxN, valid_BxN, rows_BxR))))
  print(f"batch {b} x {p + g} positions, {args.mesh} vs one device, "
        f"{jax.default_backend()}, jax {jax.__version__}")
  for i in range(k):
    differ = np.nonzero((one[i] != sharded[i]).any(1))[0].tolist()
    print(f"iteration {i}: rows differing {differ}; one device = its "
          f"iteration 0: {bool((one[i] == one[0]).all())}; mesh = its "
          f"iteration 0: {bool((sharded[i] == sharded[0]).all())}")


if __name__ == "__main__":
  main()
