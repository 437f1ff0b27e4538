"""Split groups of the scheduled attention kernel: one program runs a group
of consecutive key splits one after another, each from a fresh online
softmax into its own partial, so the group (chosen from the batch size by
`tiling.split_group_for`) changes the program count and no bit of any
output or mass.

CPU runs the kernel in Pallas interpret mode; GPU-marked tests run Triton.
"""

import argparse
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flash_dllm_bench import tuning
from flash_dllm_jax.ops import choice
from pallas_kernels.attention import api
from pallas_kernels.attention.tiling import (Tiling, _default_block_r,
                                             key_splits, split_group_for)
from tests.attention_case import check as _check, inputs as _inputs
from tests.kernel_case import gpu, rng as _rng

H, KH, D = 4, 2, 16


def _run(args, kw, impl="pallas_interpret", **options):
  o, mass = api.scheduled_attention(*args, **kw, implementation=impl,
                                    **options)
  return np.asarray(o, np.float32), np.asarray(mass)


# (Q, S, split_tiles, groups, dtype, in-query keys, score, score_prefix):
# block_k 16, so S = 150 is 10 key tiles, S = 120 eight; the last case's
# mass runs on its own 16-row prefix tile (24 folded rows in tiles of 32).
# A group of every split merges in its program (no partials).
CASES = {
    "5_splits_f32_new_mass": (4, 150, 2, (2, 3, 5), jnp.float32, 5, "mass",
                              None),
    "4_splits_bf16_new_logit": (4, 120, 2, (4,), jnp.bfloat16, 5,
                                "logit", None),
    "3_splits_bf16_prefix_mass": (12, 150, 4, (2, 3), jnp.bfloat16, 0,
                                  "mass", 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_split_group_keeps_the_bits(request, name):
  """Every group gives group 1's output and mass, bit for bit (the last
  program of a group that does not divide the splits runs fewer)."""
  q, s, split_tiles, groups, dtype, t, score, prefix = CASES[name]
  args, kw = _inputs(_rng(request), 2, q, H, KH, D, s, t, [s, s - 37],
                     [q, q - 1], dtype)
  kw.update(score=score, score_prefix=prefix)
  run = lambda g: _run(args, kw, block_k=16, split_tiles=split_tiles,
                       split_group=g, head_mass=True)
  want_o, want_m = run(1)
  _check(args, kw, (want_o, api.sum_heads(want_m)), dtype)
  for g in groups:
    got_o, got_m = run(g)
    np.testing.assert_array_equal(got_o, want_o, f"o, group {g}")
    np.testing.assert_array_equal(got_m, want_m, f"mass, group {g}")


def test_a_program_holding_every_split_merges_them_itself():
  """Group = splits: one kernel call (attention and its mass), no float32
  partials and no combine or mass-only call; a smaller group keeps them.
  Its bits are group 1's (test_a_split_group_keeps_the_bits)."""
  args, kw = _inputs(np.random.default_rng(0), 2, 4, H, KH, D, 150, 5,
                     [150, 113], [4, 3], jnp.float32)
  kw.update(head_mass=True)

  def kernels(group):
    run = lambda *a: api.scheduled_attention(
        *a, **kw, implementation="pallas_interpret", block_k=16,
        split_tiles=2, split_group=group)
    return set(re.findall(r"name=(scheduled_attention\w*)",
                          str(jax.make_jaxpr(run)(*args))))

  assert kernels(5) == {"scheduled_attention"}
  assert kernels(2) == {"scheduled_attention", "scheduled_attention_combine",
                        "scheduled_attention_mass"}


def test_split_group_for_follows_the_batch():
  """The smallest group keeping batch * kh * n_rt * cdiv(splits, group)
  programs within the target; all splits in one program past it; group 1
  without a target or without splits."""
  # LLaDA-8B, 128 queries: 32 kv heads x 2 row tiles, 5 splits at S = 1280.
  assert split_group_for(1, 32, 2, 5, 264) == 2    # 3 programs a row tile
  assert split_group_for(1, 32, 1, 5, 264) == 1    # 160 programs
  assert split_group_for(32, 32, 2, 5, 264) == 5   # one program a row tile
  assert split_group_for(1, 32, 2, 5, None) == 1
  assert split_group_for(64, 32, 2, 1, 264) == 1
  for b, splits, target in [(1, 7, 20), (2, 7, 20), (3, 9, 30), (5, 9, 8)]:
    g = split_group_for(b, 2, 1, splits, target)
    fits = lambda g: b * 2 * -(-splits // g) <= target
    assert (fits(g) or g == splits) and (g == 1 or not fits(g - 1))
  # through the wrapper's rule: the tiling's target, a given group capped
  tiling = Tiling(split_target=132, group_target=264)
  assert key_splits(1, 32, 2, 1280, 64, tiling=tiling) == (4, 5, 2)
  assert key_splits(32, 32, 2, 1280, 64, tiling=tiling) == (4, 5, 5)
  assert key_splits(32, 32, 2, 1280, 64, split_group=9) == (20, 1, 1)
  with pytest.raises(ValueError, match="split_group must be"):
    key_splits(1, 32, 2, 1280, 64, split_group=0)


@pytest.mark.parametrize("impl,dtype,b,shape", [
    ("pallas_interpret", jnp.float32, 8, (4, H, KH, D, 150)),
    gpu("pallas", jnp.bfloat16, 32, (128, 32, 32, 128, 1280))])
def test_a_row_is_the_same_alone_and_in_a_grouped_batch(request, impl, dtype,
                                                        b, shape):
  """The group_target rule: row 0 alone runs its splits in more programs
  (a smaller group) than in a batch of b (one program a row tile); same
  bits. On a GPU at LLaDA-8B's shapes with the `auto` rule of an H200."""
  q, h, kh, d, s = shape
  tiling = (Tiling(split_target=4, split_tiles=2, group_target=10)
            if impl == "pallas_interpret"
            else Tiling(split_target=132, group_target=264))
  block_k = 16 if impl == "pallas_interpret" else 64
  n_rt = -(-q * (h // kh) // _default_block_r(q * (h // kh)))
  alone = key_splits(1, kh, n_rt, s, block_k, tiling=tiling)
  batch = key_splits(b, kh, n_rt, s, block_k, tiling=tiling)
  assert alone[1] > 1 and alone[2] < batch[2] == alone[1]
  args, kw = _inputs(_rng(request), b, q, h, kh, d, s, 5,
                     [s - 20] + [s - 50] * (b - 1), [q] * b, dtype)
  run = lambda a, k: _run(a, k, impl, block_k=block_k, tiling=tiling)
  got = run(args, kw)
  want = run(tuple(x[:1] for x in args),
             {k: v[:1] if hasattr(v, "shape") else v for k, v in kw.items()})
  np.testing.assert_array_equal(got[0][:1], want[0])
  np.testing.assert_array_equal(got[1][:1], want[1])


def test_group_target_is_validated():
  # the kernel's own default: no grouping (the entry points' default is
  # choice.default_tiling, the automatic split)
  assert Tiling().group_target is None
  assert Tiling(group_target=1).group_target == 1
  for bad in (0, -3, 2.5, "264"):
    with pytest.raises(ValueError, match="group_target must be None or"):
      Tiling(group_target=bad)


def test_auto_split_target_parses_to_the_batch_rule(monkeypatch):
  """--attention-split-target auto: split_target = the device's SM count
  (132 where it does not tell, as on a CPU), group_target twice it, and
  the default of every entry point (Kernels(), a kernel name, no flag);
  N: that split target, each split in its own program; the benchmarks'
  flags take both."""
  ap = argparse.ArgumentParser()
  choice.add_flags(ap)
  parse = lambda *a: choice.kernels_from_args(ap.parse_args(list(a)))
  assert parse() is None
  auto = Tiling(split_target=132, group_target=264)
  assert parse("--attention-split-target", "132").attention == Tiling(
      split_target=132)
  assert parse("--attention-split-target", "auto").attention == auto
  assert choice.Kernels().attention == auto
  assert choice.tiling(None) == choice.tiling("pallas") == auto
  monkeypatch.setattr(choice, "device_sm_count", lambda: 78)
  assert parse("--attention-split-target", "auto").attention == Tiling(
      split_target=78, group_target=156)
  assert choice.Kernels().attention == Tiling(split_target=78,
                                              group_target=156)
  with pytest.raises(SystemExit):
    ap.parse_args(["--attention-split-target", "many"])
  bench = argparse.ArgumentParser()
  tuning.add_args(bench)
  kernels = tuning.apply(bench, bench.parse_args(
      ["--attention-split-target", "auto", "--attention-block-k", "32"]))
  assert kernels.attention == Tiling(split_target=78, group_target=156,
                                     block_k=32)
  for flags, want in (([], Tiling(split_target=78, group_target=156)),
                      (["--attention-split-target", "32"], Tiling())):
    kernels = tuning.apply(bench, bench.parse_args(flags))
    assert kernels.attention == want, flags


def test_benchmarks_set_the_split_length():
  """--attention-split-tiles and the `split-tiles=N` variant set the key
  tiles of a split (the kernel's rows keep their bits at any batch for any
  split length: the cases above); a bad length is refused by name."""
  bench = argparse.ArgumentParser()
  tuning.add_args(bench)
  tuning.add_variant_args(bench)
  args = bench.parse_args(["--attention-split-tiles", "8", "--variants",
                           "default", "split-tiles=16,split=32"])
  base = tuning.apply(bench, args)
  assert base.attention.split_tiles == 8
  (_, default), (label, longer) = tuning.variants(bench, args, base)
  assert default == base and label == "split-tiles=16,split=32"
  assert longer.attention == dataclasses.replace(
      base.attention, split_tiles=16, split_target=32, group_target=None)
  for flags in (["--attention-split-tiles", "0"],
                ["--variants", "split-tiles=0"],
                ["--variants", "split-tiles=many"]):
    args = bench.parse_args(flags)
    with pytest.raises(SystemExit):
      tuning.variants(bench, args, tuning.apply(bench, args))
