"""LLaDA's masked-diffusion training objective.

For each row draw t ~ U(eps, 1); mask every response token independently with
probability t (the prompt is never masked); the loss is the cross-entropy of
the masked tokens weighted by 1/t. As in LLaDA's SFT code, a row's weighted
sum is divided by its response length and rows are averaged, so the loss is
an upper bound on the per-token negative log-likelihood of the response.

Rows are (prompt + response) tokens with a prompt mask and a validity mask:
invalid positions (batch padding) are never masked, never counted and never
attended to. Response EOS padding is valid: it is trained on, which teaches
the model to end its answer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flash_dllm_jax.architectures.diffusion_gemma.config import GemmaConfig
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.model import Transformer
from flash_dllm_jax.ops.choice import Kernels
from flash_dllm_train.block_objective import two_copy_logits
from flash_dllm_train.canvas_objective import canvas_loss_fn

DEFAULT_EPS = 1e-3


def diffusion_draws(rng: jax.Array, batch: int, length: int,
                    eps: float = DEFAULT_EPS) -> tuple[jax.Array, jax.Array]:
  """(t_B ~ U(eps, 1), u_BxN ~ U(0, 1)): a token is masked iff u < t."""
  rng_t, rng_u = jax.random.split(rng)
  t_B = eps + (1.0 - eps) * jax.random.uniform(rng_t, (batch,))
  return t_B, jax.random.uniform(rng_u, (batch, length))


def noise_tokens(tokens_BxN: jax.Array, response_BxN: jax.Array,
                 t_B: jax.Array, u_BxN: jax.Array, mask_token_id: int,
                 ) -> tuple[jax.Array, jax.Array]:
  """(noisy_BxN, masked_BxN): response tokens with u < t become the mask."""
  masked_BxN = response_BxN & (u_BxN < t_B[:, None])
  return jnp.where(masked_BxN, mask_token_id, tokens_BxN), masked_BxN


def masked_diffusion_loss(logits_BxNxV: jax.Array, tokens_BxN: jax.Array,
                          masked_BxN: jax.Array, response_BxN: jax.Array,
                          t_B: jax.Array) -> tuple[jax.Array, dict]:
  """The loss from a forward's logits (float32) and the draws.

  loss = mean_b [ sum_{i masked} CE_bi / t_b ] / |response_b|
  Metrics: masked_ce and masked_acc over all masked tokens of the batch,
  mask_frac (masked / response tokens), mean_t.
  """
  logp_BxNxV = jax.nn.log_softmax(logits_BxNxV.astype(jnp.float32), axis=-1)
  ce_BxN = -jnp.take_along_axis(logp_BxNxV, tokens_BxN[..., None],
                                axis=-1)[..., 0]
  weighted_BxN = jnp.where(masked_BxN, ce_BxN / t_B[:, None], 0.0)
  length_B = jnp.maximum(response_BxN.sum(-1), 1).astype(jnp.float32)
  loss = jnp.mean(weighted_BxN.sum(-1) / length_B)
  n_masked = masked_BxN.sum()
  denom = jnp.maximum(n_masked, 1).astype(jnp.float32)
  correct_BxN = jnp.argmax(logits_BxNxV, axis=-1) == tokens_BxN
  metrics = {
      "loss": loss,
      "masked_ce": jnp.where(masked_BxN, ce_BxN, 0.0).sum() / denom,
      "masked_acc": (correct_BxN & masked_BxN).sum() / denom,
      "mask_frac": n_masked / jnp.maximum(response_BxN.sum(), 1),
      "mean_t": t_B.mean(),
  }
  return loss, metrics


def positions_of(valid_BxN: jax.Array) -> jax.Array:
  """RoPE positions counted from each row's first valid token (as generate
  does for left-padded prompts); 0 before it."""
  return jnp.maximum(jnp.cumsum(valid_BxN.astype(jnp.int32), axis=-1) - 1, 0)


def loss_fn(params, batch: dict, rng: jax.Array, *, config: ModelConfig,
            eps: float = DEFAULT_EPS, implementation=None,
            block_length: int = 32) -> tuple[jax.Array, dict]:
  """The objective on one batch {"tokens_BxN", "prompt_BxN", "valid_BxN"}:
  draws t and the mask from `rng`, runs the model, returns (loss, metrics).
  Block-causal architectures train with the block-diffusion objective
  (block_objective.py, blocks of `block_length`), DiffusionGemma with its
  SFT objective (canvas_objective.py, canvases of `block_length`, t ~
  U(eps, 1 - eps)); an MoE's metrics carry
  "expert_load", {layer name: tokens per expert [X]}. Jit-able (config
  static); differentiable in params."""
  if isinstance(config, GemmaConfig):  # canvas_objective.py
    if implementation not in (None, "reference"):
      raise ValueError("DiffusionGemma trains through its plain forward: "
                       f"implementation must be None or 'reference', got "
                       f"{implementation!r}")
    return canvas_loss_fn(params, batch, rng, config=config,
                          canvas=block_length, eps=eps)
  tokens_BxN = batch["tokens_BxN"]
  valid_BxN = batch["valid_BxN"].astype(bool)
  response_BxN = valid_BxN & ~batch["prompt_BxN"].astype(bool)
  b, n = tokens_BxN.shape
  t_B, u_BxN = diffusion_draws(rng, b, n, eps)
  noisy_BxN, masked_BxN = noise_tokens(tokens_BxN, response_BxN, t_B, u_BxN,
                                       config.mask_token_id)
  if config.moe is not None and not isinstance(implementation, Kernels):
    # The grouped expert kernel has no VJP: train through the dense path.
    implementation = Kernels(name=implementation, experts=None)
  model = Transformer(config, implementation=implementation)
  positions_BxN = positions_of(valid_BxN)
  if config.spec.attention.mask == "block_causal":
    logits_BxNxV, state = two_copy_logits(
        model, params, noisy_BxN, tokens_BxN, positions_BxN, valid_BxN,
        block_length)
  else:  # intermediates: an MoE's expert loads (nothing else is sown here)
    (logits_BxNxV, _), state = model.apply(
        {"params": params}, noisy_BxN, positions_BxN, valid_BxN,
        mutable=["intermediates"])
  if config.logits_shift:  # Dream: row i-1 predicts token i
    logits_BxNxV = jnp.concatenate([logits_BxNxV[:, :1],
                                    logits_BxNxV[:, :-1]], axis=1)
  loss, metrics = masked_diffusion_loss(logits_BxNxV, tokens_BxN, masked_BxN,
                                        response_BxN, t_B)
  if config.moe is not None:
    metrics["expert_load"] = expert_loads(state)
  return loss, metrics


def expert_loads(state: dict) -> dict:
  """{"layers_N": tokens per expert [X]} from a forward's intermediates."""
  inter = state.get("intermediates", {})
  return {name: layer["moe"]["expert_load"][0]
          for name, layer in inter.items()
          if "moe" in layer and "expert_load" in layer["moe"]}
