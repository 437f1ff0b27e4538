"""DiffusionGemma's SFT objective, restated from google-deepmind/gemma
(gemma/diffusion/hackable_diffusion_adapter/hd/sft_model.py SFTDiffusion,
configs/sft_*.py, data/data.py) over the family's own forward (model.py).

A row is the prompt, then the answer cut into canvases of C tokens from the
prompt's end (the answer ends with END_OF_TURN; its last canvas is filled
with EOS, the rest of the row is not used: data.CanvasChunker). Per row:

  encoder   one causal forward of prompt + answer canvases: next-token
            cross-entropy over them (EncoderARLoss), and the K/V cache;
  canvas    one of the row's canvases, uniformly; t ~ U(eps, 1 - eps);
            each of its tokens kept with probability 1 - t, else a uniform
            id in [0, n_text_ids) (CategoricalProcess.uniform_process with
            LinearDiscreteSchedule);
  decoder   the noisy canvas at its own slots against the encoder's cache:
            it sees the prompt, the clean earlier canvases and itself
            (bidirectionally; local layers within their window), exactly
            the sampler's view of a canvas being denoised;
  two-pass  a first pass with no self-conditioning; with probability
            sc_prob (0.5) its logits, stopped, are the second pass's
            self-conditioning signal (Embedder.encode_logits), else none;
  loss      cross-entropy of the second pass over every canvas token
            (NoWeightDiscreteLoss on target_mask: corrupted or not, no
            weighting in t), per row, averaged over rows; plus the
            encoder's (weight encoder_weight, 1 as the official configs).

"No self-conditioning" is an all-zero signal, what the sampler feeds a
canvas's first step (the official SFT feeds encode_logits(0), the mean
embedding row, which its sampler never does). Shapes: B rows, N tokens,
C canvas, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax.architectures.diffusion_gemma import model as dg
from flash_dllm_jax.architectures.diffusion_gemma.config import GemmaConfig

TIME_EPS = 1e-4  # the official SafeSpan(safety_epsilon=1e-4)
SC_PROB = 0.5  # SFTDiffusion.self_cond_prob


def canvas_layout(tokens_BxN, prompt_BxN, end_id: int, canvas: int):
  """(prompt length [B], answer canvases [B] >= 1): canvases from the
  prompt's end up to the one holding the first `end_id`, as many as fit
  in N (a row without end_id: all that fit)."""
  n = tokens_BxN.shape[1]
  lp_B = jnp.sum(prompt_BxN, axis=1, dtype=jnp.int32)
  pos_N = jnp.arange(n)
  is_end = (tokens_BxN == end_id) & (pos_N[None] >= lp_B[:, None])
  end_B = jnp.where(jnp.any(is_end, axis=1), jnp.argmax(is_end, axis=1),
                    n - 1)
  count_B = (end_B - lp_B) // canvas + 1
  fit_B = (n - lp_B) // canvas
  return lp_B, jnp.maximum(jnp.minimum(count_B, fit_B), 1)


def canvas_draws(rng, batch: int, canvas: int, count_B, n_ids: int,
                 eps: float = TIME_EPS, sc_prob: float = SC_PROB) -> dict:
  """The random draws of one step: t_B ~ U(eps, 1 - eps), keep_BxC
  (u < 1 - t), noise_BxC uniform ids, the canvas sel_B in [0, count_B),
  sc_B (self-conditioned second pass)."""
  k_t, k_keep, k_noise, k_sel, k_sc = jax.random.split(rng, 5)
  t_B = jax.random.uniform(k_t, (batch,), minval=eps, maxval=1.0 - eps)
  keep = jax.random.uniform(k_keep, (batch, canvas)) < (1.0 - t_B)[:, None]
  return {"t_B": t_B, "keep_BxC": keep,
          "noise_BxC": jax.random.randint(k_noise, (batch, canvas), 0, n_ids),
          "sel_B": jax.random.randint(k_sel, (batch,), 0, count_B),
          "sc_B": jax.random.uniform(k_sc, (batch,)) < sc_prob}


def cross_entropy(logits_BxQxV, targets_BxQ):
  """[B, Q] float32 cross-entropy of the targets."""
  logp = jax.nn.log_softmax(logits_BxQxV.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, targets_BxQ[..., None], axis=-1)[..., 0]


def _row_mean(x_BxQ, mask_BxQ):
  den = jnp.maximum(mask_BxQ.sum(-1), 1).astype(jnp.float32)
  return jnp.where(mask_BxQ, x_BxQ, 0.0).sum(-1) / den


def canvas_passes(p, config: GemmaConfig, tokens_BxN, lp_B, count_B,
                  draws: dict, canvas: int) -> dict:
  """The three forwards (params `p` in the compute dtype): "enc_logits"
  [B, N, V] and "used_BxN" of the causal encoder pass over prompt +
  answer canvases (slot = position); the selected canvas's "slots_BxC",
  clean "x0_BxC" and noised "xt_BxC"; its decoder logits without
  self-conditioning ("first") and with the draws' ("sc_BxCxD",
  "logits"), both against the encoder's cache."""
  b, n = tokens_BxN.shape
  dtype = jnp.dtype(config.dtype)
  pos_N = jnp.arange(n)
  used_BxN = pos_N[None] < (lp_B + count_B * canvas)[:, None]
  slots_BxN = jnp.where(used_BxN, pos_N[None], -1)
  enc_logits, cache = dg.forward(
      p, config, tokens_BxN, slots_BxN, dg.empty_cache(config, b, n, dtype),
      dg.causal(slots_BxN))
  slots_BxC = (lp_B + draws["sel_B"] * canvas)[:, None] + jnp.arange(canvas)
  x0_BxC = jnp.take_along_axis(tokens_BxN, slots_BxC, axis=1)
  xt_BxC = jnp.where(draws["keep_BxC"], x0_BxC, draws["noise_BxC"])
  last = dg.canvas(slots_BxC)
  zeros = jnp.zeros((b, canvas, config.d_model), dtype)
  first, _ = dg.forward(p, config, xt_BxC, slots_BxC, cache, last, zeros)
  signal = dg.encode_logits(p, config, jax.lax.stop_gradient(first))
  sc = jnp.where(draws["sc_B"][:, None, None], signal.astype(dtype), zeros)
  logits, _ = dg.forward(p, config, xt_BxC, slots_BxC, cache, last, sc)
  return {"enc_logits": enc_logits, "used_BxN": used_BxN,
          "slots_BxC": slots_BxC, "x0_BxC": x0_BxC, "xt_BxC": xt_BxC,
          "first": first, "sc_BxCxD": sc, "logits": logits}


def canvas_loss(out: dict, tokens_BxN, lp_B, draws: dict, canvas: int,
                encoder_weight: float = 1.0) -> tuple[jax.Array, dict]:
  """(loss, metrics) from canvas_passes' `out`: per row the decoder's
  mean cross-entropy over the canvas plus encoder_weight times the
  encoder's mean next-token cross-entropy, averaged over the rows whose
  prompt leaves room for a canvas."""
  n = tokens_BxN.shape[1]
  used_BxN = out["used_BxN"]
  enc_mask = used_BxN[:, :-1] & used_BxN[:, 1:]
  enc_ce_B = _row_mean(cross_entropy(out["enc_logits"][:, :-1],
                                     tokens_BxN[:, 1:]), enc_mask)
  logits, x0_BxC = out["logits"], out["x0_BxC"]
  dec_B = cross_entropy(logits, x0_BxC).mean(-1)
  ok_B = lp_B + canvas <= n
  rows = jnp.maximum(ok_B.sum(), 1).astype(jnp.float32)
  mean = lambda x_B: jnp.where(ok_B, x_B, 0.0).sum() / rows
  loss = mean(dec_B + encoder_weight * enc_ce_B)
  right = (jnp.argmax(logits, axis=-1) == x0_BxC) & ok_B[:, None]
  noised = ~draws["keep_BxC"] & ok_B[:, None]
  metrics = {
      "loss": loss, "masked_ce": mean(dec_B),
      "masked_acc": right.sum() / (rows * canvas),
      "noised_acc": (right & noised).sum() / jnp.maximum(noised.sum(), 1),
      "encoder_ce": mean(enc_ce_B), "mean_t": draws["t_B"].mean()}
  return loss, metrics


def canvas_loss_fn(params, batch: dict, rng: jax.Array, *,
                   config: GemmaConfig, canvas: int, eps: float = TIME_EPS,
                   sc_prob: float = SC_PROB, encoder_weight: float = 1.0,
                   ) -> tuple[jax.Array, dict]:
  """The objective on one batch {"tokens_BxN", "prompt_BxN", ...}
  (objective.loss_fn's rows; "valid_BxN" is not used: the canvases come
  from the prompt length and the first END_OF_TURN): draws from `rng`,
  the passes, the loss. Float32 params, computed in config.dtype.
  Metrics: loss; masked_ce / masked_acc over the selected canvases' tokens
  (the denoising loss and its argmax accuracy), noised_acc over their
  corrupted tokens, encoder_ce, mean_t."""
  tokens_BxN = batch["tokens_BxN"].astype(jnp.int32)
  p = jax.tree.map(lambda x: x.astype(jnp.dtype(config.dtype)), params)
  lp_B, count_B = canvas_layout(tokens_BxN, batch["prompt_BxN"],
                                config.end_of_turn_id, canvas)
  d = canvas_draws(rng, tokens_BxN.shape[0], canvas, count_B,
                   config.n_text_ids, eps, sc_prob)
  out = canvas_passes(p, config, tokens_BxN, lp_B, count_B, d, canvas)
  return canvas_loss(out, tokens_BxN, lp_B, d, canvas, encoder_weight)
