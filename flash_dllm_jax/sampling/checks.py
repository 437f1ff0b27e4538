"""Argument checks shared by the samplers (each option's own range: its
declaration, sampling/options.py)."""

import numbers
from typing import Sequence


def check_fits(prompt_len: int, gen_length: int, max_seq_len: int,
               needs_prompt: str | None = None, tail: int = 0) -> None:
  """The padded prompt plus the generation (plus `tail` positions a block
  sampler allocates after it) must fit the model; needs_prompt names a
  sampler that reads position i's prediction from position i - 1 and so
  needs at least one prompt token."""
  if needs_prompt and prompt_len < 1:
    raise ValueError(f"{needs_prompt} needs a prompt of at least one token: "
                     "the prediction for position i is read from position i-1")
  if prompt_len + gen_length + tail > max_seq_len:
    after = f" + the last block's tail ({tail})" if tail else ""
    raise ValueError(f"prompt ({prompt_len}) + gen_length ({gen_length})"
                     f"{after} exceeds max_seq_len {max_seq_len}")


def block_schedule_errors(gen_length: int, block_length: int,
                          steps: int) -> list[str]:
  """Errors of a semi-autoregressive schedule of valid positive ints:
  gen_length a multiple of block_length, steps a multiple of the number
  of blocks."""
  if gen_length % block_length:
    return [f"gen_length ({gen_length}) must be a multiple of "
            f"block_length ({block_length})"]
  if steps % (gen_length // block_length):
    return [f"steps ({steps}) must be a multiple of the number of blocks "
            f"({gen_length // block_length})"]
  return []


def unfit_prompts(lengths: Sequence[int], sampler,
                  max_seq_len: int) -> list[tuple[int, int, str]]:
  """(index, real length, why) of every prompt that cannot fit with the
  sampler's generation. Only real lengths count: padding to a bucket is
  capped so that it never makes a fitting prompt fail."""
  bad = []
  for i, n in enumerate(lengths):
    try:
      sampler.check_prompt(n, max_seq_len)
    except ValueError as e:
      bad.append((i, n, str(e)))
  return bad


def check_lengths(lengths: Sequence[int], sampler, max_seq_len: int) -> None:
  """One ValueError naming every prompt (index, real length) that cannot fit
  the model with the generation."""
  bad = unfit_prompts(lengths, sampler, max_seq_len)
  if bad:
    raise ValueError(f"{len(bad)} of {len(lengths)} prompt(s) do not fit: "
                     + "; ".join(f"prompt {i} ({n} tokens): {why}"
                                 for i, n, why in bad))


def token_error(ids: Sequence[int], mask_token_id: int,
                vocab_size: int) -> str | None:
  """Why a prompt's token ids cannot be decoded (it holds the mask token, or
  an id outside the vocabulary), or None."""
  if mask_token_id in ids:
    return f"contains the mask token id {mask_token_id}"
  outside = sorted({t for t in ids if not 0 <= t < vocab_size})
  if outside:
    return f"has token ids outside [0, {vocab_size}): {outside[:5]}"
  return None


SEED_LIMIT = 2 ** 32  # a row's seed becomes a uint32 PRNG key


def check_seeds(seeds: Sequence, what: str = "seed") -> None:
  """One ValueError naming the first seed that is not an int in
  [0, 2**32) (NumPy would raise an OverflowError deep in the decode)."""
  for i, seed in enumerate(seeds):
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) \
        or not 0 <= seed < SEED_LIMIT:
      where = f" (row {i})" if len(seeds) > 1 else ""
      raise ValueError(f"{what} must be an int in [0, 2**32), got "
                       f"{seed!r}{where}")
