"""Log-probabilities of a prompt's own tokens, for completions `echo` with
`logprobs` (lm-eval's `local-completions` scores log-likelihood this way).

Token j's value is the lm-eval adapter's estimator (likelihood.py) for the
one-token continuation x_j after the prefix x_<j: x_j masked alone at the
end of the sequence, weight 1. With one token to mask the estimate has no
randomness left: it equals `likelihood.estimate_many` on (prefix x_<j,
target [x_j], mask [[True]], weight [1]), which under the "count" scheme
(LLaDA, LLaDA2) is the adapter's loglikelihood of any one-token
continuation, for every mc_num; under Dream's "rate" scheme the adapter
draws whether to mask it, and this is that estimator's expectation with the
token always masked. A multi-token continuation's sum of these is the
left-to-right chain of one-token estimates, not the adapter's joint
Monte-Carlo estimate. The top-k alternatives come from the same
distribution. The first token has no prefix: None, as in OpenAI's answers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flash_dllm_jax.compilation import _BatchInvariantJit
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.prompts import padded_length
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.serve.protocol import MAX_LOGPROBS

MAX_TOP = MAX_LOGPROBS  # alternatives computed (the most a request asks)
ROWS = 16  # rows per forward: a long prompt's L rows go in chunks


def _scores(params, tokens_BxN, valid_BxN, rows_Bx1, targets_B, *,
            config: ModelConfig, block_length: int | None):
  """(own log-prob [B], top log-probs [B, MAX_TOP], their ids [B, MAX_TOP])
  at each row's one logits row."""
  model = SequenceModel.for_batch(config, params, valid_BxN)
  logits_BxV = model.logits(tokens_BxN, rows_Bx1, block_length)[:, 0]
  logp_BxV = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), axis=-1)
  own_B = jnp.take_along_axis(logp_BxV, targets_B[:, None], -1)[:, 0]
  top_lp, top_id = jax.lax.top_k(logp_BxV, MAX_TOP)
  return own_B, top_lp, top_id


_scores_jit = _BatchInvariantJit(_scores,
                                 static_argnames=("config", "block_length"))


def layout(config: ModelConfig, ids: list[int]):
  """The forward's inputs for a prompt of L >= 2 tokens: row j - 1 holds
  x_<j then a mask (left-padded to a multiple of 64), rows padded to a
  multiple of ROWS by copies of the first (so prompts of similar lengths
  share a compile)."""
  el = len(ids)
  n, b = padded_length(el), padded_length(el - 1, ROWS)
  tokens = np.full((b, n), config.pad_token_id, np.int32)
  valid = np.zeros((b, n), bool)
  targets = np.zeros(b, np.int32)
  for r in range(b):
    j = 1 + (r if r < el - 1 else 0)
    tokens[r, n - j - 1:n - 1] = ids[:j]
    tokens[r, n - 1] = config.mask_token_id
    valid[r, n - j - 1:] = True
    targets[r] = ids[j]
  rows = np.full((b, 1), n - 1 - config.logits_shift, np.int32)
  return tokens, valid, rows, targets


def prompt_logprobs(params, config: ModelConfig, ids: list[int],
                    block_length: int | None = None
                    ) -> tuple[list[float | None], list[list | None]]:
  """(log-prob of each prompt token, its [(id, log-prob)] * MAX_TOP
  alternatives, likeliest first); None for the first token."""
  if len(ids) < 2:
    return [None] * len(ids), [None] * len(ids)
  arrays = layout(config, ids)
  parts = [[np.asarray(x) for x in _scores_jit(
      params, *(jnp.asarray(a[s:s + ROWS]) for a in arrays),
      config=config, block_length=block_length)]
           for s in range(0, len(arrays[0]), ROWS)]
  own, top_lp, top_id = (np.concatenate(x) for x in zip(*parts))
  el = len(ids) - 1
  return ([None] + [float(x) for x in own[:el]],
          [None] + [[(int(i), float(v)) for i, v in zip(top_id[r],
                                                         top_lp[r])]
                    for r in range(el)])
