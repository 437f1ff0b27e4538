"""Fast-dLLM v2's forwards under the benchmark's fixed schedule, by kind.

The benchmark decodes Fast-dLLM v2 with a zero final-norm scale: every
logit is 0, every confidence ties, so a step of `fast-dllm-v2` at threshold
1 commits exactly the first mask of the current sub-block (argmax takes the
first on ties) and the steps do not depend on the random weights. With the
sub-block cache, whether a step runs the whole block or the sub-block alone
follows the reference's rule (NVlabs/Fast-dLLM v2 `batch_sample`,
`use_block_cache`): a whole-block forward at a block's first denoise step
and whenever the sub-block's first position is still a mask; the sub-block
alone otherwise. `forward_kinds` replays that schedule on the host so the
roofline counts the forwards that run.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from flash_dllm_jax.strategies import build_sampler


@dataclasses.dataclass(frozen=True)
class Forwards:
  """One row's steps (one forward each) by kind: `whole` forwards of the
  block (the first step's prefill and the store steps included), `sub`
  forwards of a sub-block alone; `tokens` the answer positions filled."""
  whole: int
  sub: int
  tokens: int

  @property
  def steps(self) -> int:
    return self.whole + self.sub


def forward_kinds(prompt: int, gen: int, block: int, sub_block: int,
                  sub_block_cache: bool) -> Forwards:
  """The forwards of one row of `prompt` tokens decoding `gen` (a multiple
  of `block`) in blocks counted from the first prompt token, sub-blocks of
  `sub_block`, one mask a step left to right (the tie schedule above), as
  the `fast-dllm-v2` sampler runs them: a prompt ending on a block boundary
  starts with the store step of its last block; every block but the last
  ends with a store step, which also fills the next block's first token."""
  if gen % block or block % sub_block:
    raise ValueError(f"gen ({gen}) must be a multiple of block ({block}) "
                     f"and block a multiple of sub_block ({sub_block})")
  whole = sub = 0
  filled = prompt % block  # the first block's prompt positions
  if filled == 0:  # the prefill: the prompt's last block, stored
    whole, filled = 1, 1
  blocks = gen // block
  for i in range(blocks):
    for step, pos in enumerate(range(filled, block)):
      refresh = (step == 0 or not sub_block_cache or pos % sub_block == 0)
      whole += refresh
      sub += not refresh
    if i < blocks - 1:  # its store step fills the next block's first token
      whole, filled = whole + 1, 1
  tokens = blocks * block - prompt % block
  return Forwards(whole, sub, tokens)


def row(gen: int, block: int, small_block: int, cached: bool, kv: dict):
  """A Fast-dLLM v2 row, (sampler, passes) as bench_strategies builds them:
  threshold 1 over the tied confidences of a zero final norm
  (`tied_params`) commits one mask a step, left to right, so its
  whole-block and sub-block forwards are forward_kinds'. passes(prompt,
  steps, forwards) -> ([(query tokens, forwards a step)], answer tokens a
  step); it raises where the decode's steps or forwards differ from the
  schedule's (kv: the sampler's kv_cache_dtype option, if any)."""
  sampler = build_sampler("fast-dllm-v2", "fast_dllm_v2", {
      "gen_length": gen, "block_length": block,
      "small_block_length": small_block, "threshold": 1.0,
      "temperature": 0.0, "sub_block_cache": cached, **kv})

  def passes(p, steps, forwards):
    f = forward_kinds(p, gen, block, small_block, cached)
    if (steps, forwards) != (f.steps, f.steps):
      raise RuntimeError(
          f"the decode ran {steps} steps and {forwards} forwards, the tie "
          f"schedule {f.steps} of each: the floor would count other "
          "forwards than ran")
    return [(block, f.whole / steps), (small_block, f.sub / steps)], (
        f.tokens / steps)
  return sampler, passes


def tied_params(params):
  """The Fast-dLLM v2 rows' weights: a zero final-norm scale, so every
  logit is 0 and the tie schedule holds (timing does not read values)."""
  norm = params["final_norm"]
  return {**params, "final_norm": {**norm, "scale": jnp.zeros_like(
      norm["scale"])}}
