"""Training rows for SFT-style masked diffusion on GSM-format problems.

A row is the chat-templated question (the prompt, never masked) followed by
the response: the worked solution, <|eot_id|>, then <|endoftext|> up to the
sequence length. As in LLaDA's SFT the EOS padding is part of the response
and is trained on, so the model learns to end its answer. Every row has the
same length, so training compiles once.

eos_pad='random' (the default) gives each row a random number of valid EOS
(at least one) and marks the rest invalid: like LLaDA's SFT batches, padded
to the longest row of each batch, the total length varies, so the model does
not tie the end of its answer to one absolute length, and decoding works
with any gen_length up to seq_len - prompt length. 'full' pads every row to
seq_len with valid EOS.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from flash_dllm_jax.tokenizer import Tokenizer


EOS_PAD = ("random", "full")


class EncodedRows(NamedTuple):
  """tokens_MxN int32 rows (EOS-padded to N), prompt_len_M and min_len_M
  (prompt + solution + <|eot_id|> + one EOS) int32; `dropped` counts the
  problems that did not fit the sequence length."""

  tokens_MxN: np.ndarray
  prompt_len_M: np.ndarray
  min_len_M: np.ndarray
  dropped: int


def user_text(question: str, index: int) -> str:
  """The user turn: alternately the bare question and the lm-eval GSM8K
  form "Question: ...\\nAnswer:" (what `eval_gsm8k --chat --num-fewshot 0`
  sends), so the model answers both."""
  return question if index % 2 == 0 else f"Question: {question}\nAnswer:"


def encode_problems(problems: Sequence[dict], tokenizer: Tokenizer,
                    seq_len: int) -> EncodedRows:
  """Tokenizes {"question", "answer"} rows into fixed-length training rows."""
  eos, eot = tokenizer.eos_id, tokenizer.eot_id
  if eos is None or eot is None or tokenizer.mask_id is None:
    raise ValueError("the tokenizer needs EOS, <|eot_id|> and mask tokens")
  prompts = [tokenizer.apply_chat_template(
      [{"role": "user", "content": user_text(p["question"], i)}],
      add_generation_prompt=True) for i, p in enumerate(problems)]
  encode = tokenizer.backend.encode_batch
  prompt_ids = encode(prompts, add_special_tokens=False)
  answer_ids = encode([p["answer"] for p in problems],
                      add_special_tokens=False)
  rows, prompt_lens, min_lens = [], [], []
  for prompt, answer in zip(prompt_ids, answer_ids):
    ids = prompt.ids + answer.ids + [eot]
    if len(ids) + 1 > seq_len:  # keep at least one EOS after <|eot_id|>
      continue
    rows.append(ids + [eos] * (seq_len - len(ids)))
    prompt_lens.append(len(prompt.ids))
    min_lens.append(len(ids) + 1)
  tokens = np.asarray(rows, np.int32).reshape(len(rows), seq_len)
  return EncodedRows(tokens, np.asarray(prompt_lens, np.int32),
                     np.asarray(min_lens, np.int32), len(problems) - len(rows))


class Batches:
  """Deterministic batches: step s takes rows [s*B, (s+1)*B) of an endless
  stream of epochs, each a fresh permutation seeded by (seed, epoch). A
  resumed run therefore sees exactly the batches it would have seen."""

  def __init__(self, rows: EncodedRows, batch_size: int, seed: int = 0,
               eos_pad: str = "random"):
    if len(rows.tokens_MxN) == 0:
      raise ValueError("no training rows (all problems longer than seq_len?)")
    if eos_pad not in EOS_PAD:
      raise ValueError(f"eos_pad must be one of {EOS_PAD}, got {eos_pad!r}")
    self.rows, self.batch_size, self.seed = rows, batch_size, seed
    self.eos_pad = eos_pad
    self._perms: dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) >= 2:  # a batch spans at most two epochs
        self._perms.pop(min(self._perms))
      rng = np.random.default_rng([self.seed, epoch])
      self._perms[epoch] = rng.permutation(len(self.rows.tokens_MxN))
    return self._perms[epoch]

  def indices(self, step: int) -> np.ndarray:
    """Row indices [B] of batch `step`."""
    m = len(self.rows.tokens_MxN)
    flat = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
    out = np.empty(self.batch_size, np.int64)
    for epoch in np.unique(flat // m):
      sel = flat // m == epoch
      out[sel] = self._perm(int(epoch))[flat[sel] % m]
    return out

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    index_B = self.indices(step)
    length_B = pad_lengths(self.rows.min_len_M[index_B],
                           self.rows.tokens_MxN.shape[1], self.seed, step,
                           self.eos_pad)
    return rows_batch(self.rows, index_B, length_B)


def pad_lengths(min_len_B: np.ndarray, seq_len: int, seed: int, step: int,
                eos_pad: str) -> np.ndarray | None:
  """The valid length of each row of batch `step` (None: all of seq_len):
  with 'random', uniform in [min_len, seq_len], drawn from (seed, step)."""
  if eos_pad != "random":
    return None
  rng = np.random.default_rng([seed, step, 1])
  return rng.integers(min_len_B, seq_len + 1)


def rows_batch(rows: EncodedRows, index_B: np.ndarray,
               length_B: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """{"tokens_BxN", "prompt_BxN", "valid_BxN"} for the rows `index_B`;
  positions from length_B on (all valid if None) are invalid."""
  tokens_BxN = rows.tokens_MxN[index_B]
  n = tokens_BxN.shape[1]
  arange_1xN = np.arange(n)[None, :]
  prompt_BxN = arange_1xN < rows.prompt_len_M[index_B][:, None]
  valid_BxN = np.ones_like(prompt_BxN)
  if length_B is not None:
    valid_BxN = arange_1xN < np.asarray(length_B)[:, None]
  return {"tokens_BxN": tokens_BxN, "prompt_BxN": prompt_BxN,
          "valid_BxN": valid_BxN}
