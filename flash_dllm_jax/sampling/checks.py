"""Argument checks shared by the samplers."""

import dataclasses
import math
import numbers
from typing import Sequence


INT32_MAX = 2 ** 31 - 1  # device arrays hold a sampler's ints as int32


def check_finite(sampler) -> None:
  """Raises one ValueError naming every real-valued field of a sampler
  dataclass that is NaN or infinite, and every int field outside int32
  (the dtype the compiled loop stores it in). Range checks alone let NaN
  through (every comparison with it is False), and it then decodes
  garbage; an int past int32 overflows when the decode stores it."""
  bad = []
  for f in dataclasses.fields(sampler):
    value = getattr(sampler, f.name)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      continue
    if isinstance(value, numbers.Integral):
      if abs(value) > INT32_MAX:
        bad.append(f"{f.name} must fit int32 (|x| <= {INT32_MAX}), got "
                   f"{value!r}")
    elif not math.isfinite(value):
      bad.append(f"{f.name} must be a finite number, got {value!r}")
  if bad:
    raise ValueError(f"invalid {type(sampler).__name__} arguments: "
                     + "; ".join(bad))


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


def optional_positive_errors(sampler, *names: str) -> list[str]:
  """An error for each named field that is neither None nor a positive
  int (options such as refresh_every and max_refills)."""
  return [f"{name} must be None or a positive int, got {value!r}"
          for name in names if (value := getattr(sampler, name)) is not None
          and not (isinstance(value, int) and not isinstance(value, bool)
                   and value > 0)]


def block_schedule_errors(gen_length, block_length, steps) -> list[str]:
  """Errors of a semi-autoregressive schedule: positive ints, gen_length a
  multiple of block_length, steps a multiple of the number of blocks."""
  errors = []
  for name, value in (("gen_length", gen_length),
                      ("block_length", block_length), ("steps", steps)):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      errors.append(f"{name} must be a positive int, got {value!r}")
  if errors:
    return errors
  if gen_length % block_length:
    errors.append(f"gen_length ({gen_length}) must be a multiple of "
                  f"block_length ({block_length})")
  elif steps % (gen_length // block_length):
    errors.append(f"steps ({steps}) must be a multiple of the number of "
                  f"blocks ({gen_length // block_length})")
  return errors


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
