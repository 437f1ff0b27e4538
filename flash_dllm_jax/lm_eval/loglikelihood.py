"""The lm-eval model's loglikelihood requests (model.py's module doc):
LLaDA's / Dream's Monte-Carlo estimate (likelihood.py), request i drawing
its masks from NumPy generator (seed, i)."""

from __future__ import annotations

import time

import numpy as np
from tqdm import tqdm

from flash_dllm_jax import likelihood
from flash_dllm_jax.compilation import compile_clock
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.lm_eval.args import ModelArgsError
from flash_dllm_jax.prompts import padded_length
from flash_dllm_jax.strategies import STRATEGIES, sampler_options


class Loglikelihood:
  """loglikelihood / loglikelihood_rolling of the lm-eval model (a mixin
  of model.FlashDLLMJax: it reads args, config, tokenizer, params, bound,
  strategy, options and scored)."""

  def _encode_pair(self, context: str, continuation: str):
    """lm-eval's rule: trailing spaces of the context move to the
    continuation; the continuation's ids are what encoding the joined text
    adds after the context's ids. An empty context becomes BOS (EOS)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
      continuation, context = context[-n_spaces:] + continuation, \
          context[:-n_spaces]
    whole = self.tokenizer.encode(context + continuation)
    prefix = self.tokenizer.encode(context)
    target = whole[len(prefix):]
    if not prefix:
      start = self.config.bos_token_id
      prefix = [self.config.eos_token_id if start is None else start]
    return prefix, target

  def loglikelihood(self, requests, disable_tqdm: bool = False):
    if not isinstance(self.config, ModelConfig):
      raise NotImplementedError(
          f"flash_dllm_jax: loglikelihood is not supported for the "
          f"{self.arch} family (its likelihood estimate is not defined "
          "here); use generate_until tasks")
    items = []
    for i, request in enumerate(requests):
      prefix, target = self._encode_pair(*request.args)
      if not target:
        raise ValueError(f"request {i}: the continuation "
                         f"{request.args[1]!r} encodes to no tokens")
      if len(prefix) + len(target) > self.config.max_seq_len:
        raise ValueError(f"request {i}: {len(prefix)} + {len(target)} "
                         f"tokens exceed max_seq_len {self.config.max_seq_len}")
      items.append(likelihood.Request(prefix, target,
                                      *self.draw_masks(i, len(target))))
    bar = tqdm(total=len(items) * self.args.mc_num, unit="copy",
               disable=disable_tqdm, desc="flash_dllm_jax likelihood")
    with bar, compile_clock() as compiled:
      t0 = time.perf_counter()
      values, forwards = likelihood.estimate_many(
          self.params, self.config, items,
          batch_size=self.bound.rows(
              "loglikelihood",
              min(self.args.batch_size, len(items) * self.args.mc_num),
              max(padded_length(len(r.prefix) + len(r.target))
                  for r in items), copies=2 if self.args.cfg > 0 else 1),
          cfg=self.args.cfg, block_length=self.likelihood_blocks(),
          progress=bar.update)
      self.scored.add(requests=len(items), forwards=int(forwards.sum()),
                      wall_s=time.perf_counter() - t0, compile_s=compiled[0])
    return [(float(v), False) for v in values]

  def likelihood_blocks(self) -> int | None:
    """A block-causal family's attention block for the likelihood forward:
    model_args block_length, else the strategy's default; None for full
    attention."""
    if self.config.spec.attention.mask != "block_causal":
      return None
    fields = sampler_options(STRATEGIES[self.strategy].sampler)
    default = fields["block_length"][1] if "block_length" in fields else None
    block = self.options.get("block_length") or default
    if not isinstance(block, int):
      raise ModelArgsError(f"{self.config.arch} scores with its block-causal "
                           "mask: give model_args block_length")
    return block

  def draw_masks(self, index: int, target_len: int):
    """The masks of request `index` (its own NumPy generator)."""
    rng = np.random.default_rng((self.args.seed, index))
    return likelihood.draw_masks(rng, target_len, self.args.mc_num,
                                 self.args.group,
                                 self.config.spec.likelihood_masks,
                                 self.args.sampling_eps)

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
    raise NotImplementedError(
        "flash_dllm_jax: loglikelihood_rolling (perplexity tasks) is not "
        "supported; a masked-diffusion model has no left-to-right token "
        "likelihood, only the Monte-Carlo bound of loglikelihood")
