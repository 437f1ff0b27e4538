"""A server device call's queue and per-job results (model_runner.py): a
job is a request the call decodes (the row a slot held at the call's
start, or a queue entry it loaded), so a row that finishes mid-call keeps
its answer here while its slot takes the next request."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

from flash_dllm_jax.sampling.slots import EMPTY


@struct.dataclass
class Jobs:
  """tokens_JxG (mask id where undecided), logprob_JxG, done_J, steps_J,
  forwards_J; top_lp_JxGxK / top_id_JxGxK (None: not recorded); at_Q: the
  loop step after which queue entry q was loaded (-1: not loaded)."""

  tokens_JxG: jnp.ndarray
  logprob_JxG: jnp.ndarray
  done_J: jnp.ndarray
  steps_J: jnp.ndarray
  forwards_J: jnp.ndarray
  at_Q: jnp.ndarray
  top_lp_JxGxK: jnp.ndarray | None = None
  top_id_JxGxK: jnp.ndarray | None = None

  @classmethod
  def empty(cls, jobs: int, queue: int, gen: int, mask_id: int,
            top_k: int = 0) -> "Jobs":
    top = (jnp.zeros((jobs, gen, top_k), jnp.float32),
           jnp.zeros((jobs, gen, top_k), jnp.int32)) if top_k else (None,
                                                                    None)
    return cls(jnp.full((jobs, gen), mask_id, jnp.int32),
               jnp.zeros((jobs, gen), jnp.float32),
               jnp.zeros((jobs,), bool), jnp.zeros((jobs,), jnp.int32),
               jnp.zeros((jobs,), jnp.int32), jnp.full((queue,), -1,
                                                        jnp.int32), *top)

  def record(self, rows_B, job_B, decode, gen: slice) -> "Jobs":
    """The rows marked by rows_B [B] (holding job_B) as they stand in
    `decode` (a DecodeState), written to their jobs."""
    drop = self.done_J.shape[0]
    idx_B = jnp.where(rows_B & (job_B != EMPTY), job_B, drop)
    put = lambda buf, v: buf.at[idx_B].set(v.astype(buf.dtype), mode="drop")
    out = self.replace(
        tokens_JxG=put(self.tokens_JxG, decode.tokens_BxN[:, gen]),
        logprob_JxG=put(self.logprob_JxG, decode.logprob_BxN[:, gen]),
        done_J=put(self.done_J, decode.done_B),
        steps_J=put(self.steps_J, decode.steps_B),
        forwards_J=put(self.forwards_J, decode.forwards_B))
    if self.top_lp_JxGxK is None:
      return out
    return out.replace(
        top_lp_JxGxK=put(self.top_lp_JxGxK, decode.top.lp_BxNxK[:, gen]),
        top_id_JxGxK=put(self.top_id_JxGxK, decode.top.id_BxNxK[:, gen]))

  def loaded(self, entry_B, step) -> "Jobs":
    """Marks the queue entries entry_B [B] (EMPTY: none) loaded after loop
    step `step`."""
    drop = self.at_Q.shape[0]
    return self.replace(at_Q=self.at_Q.at[jnp.where(
        entry_B == EMPTY, drop, entry_B)].set(step, mode="drop"))


def pack_queue(queue, size: int, prompt_len: int, pad_id: int):
  """A call's queue, [(prompt ids, seed[, Sampling])] of at most `size`, as
  fixed-shape host arrays: (prompt_QxP left-padded, valid_QxP, seed_Q,
  [(entry, Sampling)] of the entries that carry one)."""
  if len(queue) > size:
    raise ValueError(f"a queue of {len(queue)} requests (a call takes at "
                     f"most {size})")
  prompt_QxP = np.full((size, prompt_len), pad_id, np.int32)
  valid_QxP = np.zeros((size, prompt_len), bool)
  seed_Q = np.zeros(size, np.uint32)
  rows = []
  for i, (ids, seed, *sampling) in enumerate(queue):
    if not 0 < len(ids) <= prompt_len:
      raise ValueError(f"queue entry {i}: a prompt of {len(ids)} tokens "
                       f"(the slots take 1 to {prompt_len})")
    prompt_QxP[i, prompt_len - len(ids):] = ids
    valid_QxP[i, prompt_len - len(ids):] = True
    seed_Q[i] = np.uint32(seed)
    rows += [(i, sampling[0])] if sampling else []
  return prompt_QxP, valid_QxP, seed_Q, rows
