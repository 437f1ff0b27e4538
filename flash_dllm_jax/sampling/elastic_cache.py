"""Elastic-Cache (arXiv 2510.14973; read from yxu-dev/Elastic-Cache).

A sliding window instead of fixed blocks: each step decodes the first
`window` still-masked positions (position order) by its commit rule
(commit_rules.py; the reference's: the confidence threshold, always at least
the most confident one). Every layer keeps each
position's K/V and its input hidden state as last computed. A step's query,
a fixed budget of slots per row ([tracked | new | masks], -1 = unused), is
  tracked  the union over layers of the `track_num` decoded positions that
           drew the most attention from the mask rows in the previous step
           (budget min(n_layers * track_num, N));
  new      the positions committed in the previous step (budget `window`);
  masks    the window (all open masks without block_caching); for Dream
           (config.logits_shift) the rows predicting them, position i - 1.
Layer by layer, each row tests attention drift: the tracked tokens' current
attention (this step's queries over the K cache with the query rows
written) against their previous one (queries recomputed from the stored
hidden states over the K cache before the write), cosine similarity over
heads averaged over tracked tokens and valid keys. Below `gamma` at layer l,
the row recomputes the whole sequence from layer l + 1 on (its input: the
stored hidden states with the query rows replaced). A row's first step (and
every `refresh_every` steps) runs every layer over the whole sequence. Masks
after a committed stop token are dropped.

Rows restart at their own layers without depending on each other
(elastic_forward.py). Batch-1 details of the reference adapted to batches:
the similarity averages over valid keys only (padding keys would count
zeros), and masks are dropped after the first stop token as it stands each
step (the reference trims once, at the first EOS decoded). Ties below the
threshold commit the lowest position (the reference commits every tied
maximum).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.model import KVCache
from flash_dllm_jax.sampling import (checks, commit_rules, elastic_forward,
                                     options)
from flash_dllm_jax.sampling.options import max_refills, option
from flash_dllm_jax.sampling.sequence_model import SequenceModel
from flash_dllm_jax.sampling.state import DecodeState


@struct.dataclass
class ElasticAux:
  """cache: K/V of every layer and slot. hidden[l]: x_BxNxE, each position's
  input to layer l as last computed. tracked_BxT / new_BxW: the next query's
  tracked and newly committed slots (-1 = unused). full_layers_B: layers run
  over the whole sequence so far (the reference's recompute ratio)."""

  cache: KVCache | None
  hidden: tuple[jax.Array, ...]
  tracked_BxT: jax.Array
  new_BxW: jax.Array
  full_layers_B: jax.Array


class StepTrace(NamedTuple):
  """One step: similarity_BxL (NaN where a layer ran without the test) and
  restart_B (the first layer run over the whole sequence; n_layers if
  none), plus the query slots_BxQ."""

  tokens_BxN: jax.Array
  aux: ElasticAux
  forwards_B: jax.Array
  slots_BxQ: jax.Array
  similarity_BxL: jax.Array
  restart_B: jax.Array
  logprob_BxN: jax.Array | None = None  # committed tokens' log-probability


@dataclasses.dataclass(frozen=True)
class ElasticCacheSampler(commit_rules.WindowRule):
  """Elastic-Cache decoding (greedy); defaults follow the reference.

  rule / threshold / steps: the window's commit rule (commit_rules.py):
    "threshold", or "fixed", LLaDA's even schedule of `steps` steps (default
    gen_length): exactly gen_length / steps window positions a step, most
    confident first (the reference's top-k mode, also the benchmarks'
    schedule).
  max_refills: under continuous batching, at most this many slots take a new
    request per loop step (None: any number).
  block_caching: False queries every open mask each step (not only the
    window) and tracks their attention.
  refresh_every: also recompute every layer over the whole sequence every k
    steps (1: every step, a full recomputation through the layer-wise path);
    None as the reference (only a row's first step).
  recompute_all: an uncached full forward every step, the exactness
    reference.
  gamma: any finite real; > 1 restarts after layer 0 every step, <= 0 never.
    A row's own gamma and threshold are row data (row_options.py).
  """

  row_fields: ClassVar[tuple[str, ...]] = (  # DecodeState.sampling
      "temperature", "top_p", "top_k", "threshold", "gamma")

  gen_length: int = option(256, "answer tokens decoded", ge=1)
  window: int = option(16, "positions of the decode window (at most "
                       "gen_length)", ge=1)
  track_num: int = option(1, "decoded positions tracked a layer", ge=1)
  gamma: float = option(0.9, "attention-drift level below which a layer "
                        "restarts the recomputation (> 1: every step; <= 0: "
                        "never)")
  rule: str = option("threshold", "the window's commit rule: confidence "
                     "threshold, or a fixed schedule of steps",
                     choices=commit_rules.WINDOW_RULES)
  threshold: float = option(0.9, "confidence a mask needs to commit (the "
                            "most confident always does)", gt=0, le=1,
                            needs={"rule": ("threshold",)})
  steps: int | None = option(None, "model steps of the fixed schedule (at "
                             "most gen_length)", ge=1, none="gen_length",
                             needs={"rule": ("fixed",)})
  block_caching: bool = option(True, "query only the window's masks (off: "
                               "every open mask, tracking their attention)")
  refresh_every: int | None = option(
      None, "also recompute every layer over the whole sequence every k "
      "steps", ge=1, none="only at a row's first step")
  recompute_all: bool = option(False, "an uncached full forward every step "
                               "(the exactness reference)")
  max_refills: int | None = max_refills()

  def __post_init__(self):
    options.check(self, lambda: (
        [f"window ({self.window}) must be <= gen_length ({self.gen_length})"]
        if self.window > self.gen_length else [])
        + commit_rules.window_errors(self, ("window", self.window)))

  @property
  def num_steps(self) -> int:
    return self.gen_length  # at least one commit per step

  @property
  def mask_budget(self) -> int:
    return self.window if self.block_caching else self.gen_length

  def track_budget(self, n_layers: int, n: int) -> int:
    return min(n_layers * self.track_num, n)

  def stored_bytes_per_position(self, config) -> int:
    """What a row holds per position beside its KV cache: every layer's
    stored input (ElasticAux.hidden, the model's dtype); none when
    recompute_all. The server's slot plan counts it (memory_plan.py)."""
    if self.recompute_all:
      return 0
    return config.n_layers * config.d_model * jnp.dtype(config.dtype).itemsize

  def check_prompt(self, prompt_len: int, max_seq_len: int) -> None:
    checks.check_fits(prompt_len, self.gen_length, max_seq_len)

  def init_aux(self, model: SequenceModel, tokens_BxN: jax.Array) -> ElasticAux:
    cfg = model.config
    b, n = tokens_BxN.shape
    cache, hidden = None, ()
    if not self.recompute_all:
      cache = model.empty_cache()
      hidden = tuple(jnp.zeros((b, n, cfg.d_model), jnp.dtype(cfg.dtype))
                     for _ in range(cfg.n_layers))
    t = self.track_budget(cfg.n_layers, n)
    return ElasticAux(cache=cache, hidden=hidden,
                      tracked_BxT=jnp.full((b, t), -1, jnp.int32),
                      new_BxW=jnp.full((b, self.window), -1, jnp.int32),
                      full_layers_B=jnp.zeros((b,), jnp.int32))

  def reset_rows(self, aux: ElasticAux, rows_B: jax.Array) -> ElasticAux:
    """A new request in the rows' slots: forget their query bookkeeping (the
    first step of a row, steps_B == 0, recomputes everything)."""
    r = rows_B[:, None]
    return aux.replace(tracked_BxT=jnp.where(r, -1, aux.tracked_BxT),
                       new_BxW=jnp.where(r, -1, aux.new_BxW),
                       full_layers_B=jnp.where(rows_B, 0, aux.full_layers_B))

  def propose(self, model: SequenceModel, state: DecodeState,
              rng_B: jax.Array, prompt_len: int):
    trace = self.step_trace(model, state, prompt_len, rng_B)
    return trace.tokens_BxN, trace.aux, trace.forwards_B, trace.logprob_BxN

  def step_trace(self, model: SequenceModel, state: DecodeState,
                 prompt_len: int, rng_B: jax.Array | None = None) -> StepTrace:
    """One step, with the drift tests' similarities and restarts exposed."""
    tokens_BxN, aux = state.tokens_BxN, state.aux
    cfg = model.config
    b, n = tokens_BxN.shape
    w, m, L = self.window, self.mask_budget, cfg.n_layers
    open_BxN, others_BxN = _candidates(model, tokens_BxN, prompt_len)
    masks_BxA = _first(open_BxN, m)
    window_BxW = masks_BxA[:, :w]
    pred_BxA = jnp.where(masks_BxA >= 0, masks_BxA - cfg.logits_shift, -1)
    slots_BxQ = jnp.concatenate([aux.tracked_BxT, aux.new_BxW, pred_BxA], 1)
    if self.recompute_all:
      logits_BxWxV = model.logits(tokens_BxN, jnp.maximum(pred_BxA[:, :w], 0))
      sim_BxL = jnp.full((b, L), jnp.nan)
      restart_B = jnp.zeros((b,), jnp.int32)
    else:
      logits_BxWxV, aux, sim_BxL, restart_B = self._layerwise(
          model, state, slots_BxQ, others_BxN)

    x0_BxW, conf_BxW, lp_BxW = commit_rules.proposal(
        logits_BxWxV, state, rng_B, model.config.mask_token_id)
    real_BxW = window_BxW >= 0
    commit_BxW = commit_rules.row_rule(self.commit_rule, state).commit(
        conf_BxW, real_BxW, state.steps_B)
    tokens_BxN = tokens_BxN.at[
        jnp.arange(b)[:, None], jnp.where(commit_BxW, window_BxW, n)].set(
            x0_BxW.astype(tokens_BxN.dtype), mode="drop")
    aux = aux.replace(new_BxW=jnp.where(commit_BxW, window_BxW, -1))
    logprob_BxN = jnp.zeros((b, n), jnp.float32).at[
        jnp.arange(b)[:, None], jnp.where(commit_BxW, window_BxW, n)].set(
            lp_BxW, mode="drop")
    return StepTrace(tokens_BxN, aux, jnp.ones((b,), jnp.int32), slots_BxQ,
                     sim_BxL, restart_B, logprob_BxN)

  def _layerwise(self, model, state, slots_BxQ, others_BxN):
    """The cached forward: (window logits, aux with the new cache, hidden
    states and tracked slots, similarity_BxL, restart_B)."""
    aux, steps_B = state.aux, state.steps_B
    start_B = steps_B == 0  # a row's first step
    if self.refresh_every is not None:
      start_B |= steps_B % self.refresh_every == 0
    t, q, m = aux.tracked_BxT.shape[1], slots_BxQ.shape[1], self.mask_budget
    mass_rows_BxQ = (jnp.arange(q)[None, :] >= q - m) & (slots_BxQ >= 0)
    out = elastic_forward.forward(
        model, state.tokens_BxN, slots_BxQ, mass_rows_BxQ,
        slice(q - m, q - m + self.window), others_BxN, start_B, aux.cache,
        aux.hidden, tracked=t, track_num=self.track_num,
        gamma=commit_rules.row_value(state, "gamma", self.gamma))
    full_layers_B = model.config.n_layers - out.restart_B
    aux = aux.replace(
        cache=out.cache, hidden=out.hidden,
        tracked_BxT=_first(out.attended_BxN, t),
        full_layers_B=aux.full_layers_B + full_layers_B * ~state.done_B)
    return out.logits_BxRxV, aux, out.similarity_BxL, out.restart_B


def _candidates(model, tokens_BxN, prompt_len):
  """(open_BxN: masked generation positions before the first stop token;
  others_BxN: every other valid position, the ones that may be tracked)."""
  n = tokens_BxN.shape[1]
  gen_BxN = jnp.arange(n)[None, :] >= prompt_len
  masked_BxN = (tokens_BxN == model.config.mask_token_id) & gen_BxN
  stop_BxN = gen_BxN & (jnp.isin(tokens_BxN, jnp.asarray(model.stop_ids))
                        if model.stop_ids else jnp.zeros_like(gen_BxN))
  first_B = jnp.where(stop_BxN.any(1), jnp.argmax(stop_BxN, 1), n)
  open_BxN = masked_BxN & (jnp.arange(n)[None, :] < first_B[:, None])
  return open_BxN, model.valid_BxN & ~open_BxN


def _first(mask_BxN, k):
  """[B, k]: the first k positions where mask_BxN holds, in position order
  (-1 past the last one)."""
  order_BxN = jnp.argsort(~mask_BxN, axis=1, stable=True)[:, :k]
  if order_BxN.shape[1] < k:
    order_BxN = jnp.pad(order_BxN, ((0, 0), (0, k - order_BxN.shape[1])))
  return jnp.where(jnp.arange(k)[None, :] < mask_BxN.sum(1)[:, None],
                   order_BxN, -1)
