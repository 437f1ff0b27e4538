"""DiffusionGemma's per-row decode state (`CanvasRows`) and how a row
enters and advances through it: the causal prefill of its prompt, a fresh
canvas, a finished canvas appended to the cache (sampler.py's loop calls
them inside the steps that need them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from flash_dllm_jax.architectures.diffusion_gemma import model as dg
from flash_dllm_jax.architectures.diffusion_gemma import sampler_steps as st
from flash_dllm_jax.architectures.diffusion_gemma.fast import FORWARDS
from flash_dllm_jax.sampling.state import DecodeState, where_keys


@struct.dataclass
class CanvasRows:
  """Per row: fresh_B (not prefilled yet), start_B (the current canvas's
  first slot = RoPE position), written_B (answer tokens already final),
  the canvas and its bfloat16 self-conditioning signal (as the official
  carry keeps it), its denoising step, the canvas-loop key and the
  denoising key, whether the answer ended; the K/V cache."""

  cache: tuple
  fresh_B: jax.Array
  start_B: jax.Array
  written_B: jax.Array
  canvas_BxC: jax.Array
  sc_BxCxD: jax.Array
  step_B: jax.Array
  outer_B: jax.Array
  inner_B: jax.Array
  stop_B: jax.Array


def empty(cfg, b: int, n: int, c: int) -> CanvasRows:
  """B fresh rows of N positions, canvases of C tokens."""
  # distinct buffers for every leaf: the server donates this state
  zeros = lambda: jnp.zeros((b,), jnp.int32)
  keys = lambda: jax.vmap(jax.random.key)(jnp.zeros((b,), jnp.uint32))
  return CanvasRows(
      cache=dg.empty_cache(cfg, b, n), fresh_B=jnp.ones((b,), bool),
      start_B=zeros(), written_B=zeros(),
      canvas_BxC=jnp.zeros((b, c), jnp.int32),
      sc_BxCxD=jnp.zeros((b, c, cfg.d_model), jnp.bfloat16),
      step_B=zeros(), outer_B=keys(), inner_B=keys(),
      stop_B=jnp.zeros((b,), bool))


def start_canvas(model, aux: CanvasRows, rows_B, c: int) -> CanvasRows:
  """A fresh canvas of C tokens for rows_B: the canvas loop's key split
  once, its second half split into the initial canvas's key and the
  steps' key."""
  outer_next, sample = st.split2(aux.outer_B)
  init, steps = st.split2(sample)
  canvas = st.random_tokens(init, c, model.config.n_text_ids)
  return aux.replace(
      outer_B=where_keys(rows_B, outer_next, aux.outer_B),
      inner_B=where_keys(rows_B, steps, aux.inner_B),
      canvas_BxC=jnp.where(rows_B[:, None], canvas, aux.canvas_BxC),
      sc_BxCxD=jnp.where(rows_B[:, None, None], 0, aux.sc_BxCxD
                         ).astype(aux.sc_BxCxD.dtype),
      step_B=jnp.where(rows_B, 0, aux.step_B))


def prefill(forward: str, model, state: DecodeState, aux: CanvasRows,
            rows_B, prompt_len: int, c: int) -> CanvasRows:
  """Causal prefill of rows_B's prompts (left-padded in the batch) at
  slots 0.. with FORWARDS[forward] and their first canvas; their key chain
  starts at the row's seed key (state.rng_B before the loop touches it)."""
  p = prompt_len
  length_B = jnp.sum(model.valid_BxN[:, :p], axis=1, dtype=jnp.int32)
  slots = jnp.arange(p)[None, :] - (p - length_B)[:, None]
  slots = jnp.where(rows_B[:, None] & (slots >= 0), slots, -1)
  _, cache = FORWARDS[forward](
      model, model.params, model.config, state.tokens_BxN[:, :p], slots,
      aux.cache, dg.causal(slots), logits=False)
  aux = aux.replace(
      cache=cache, fresh_B=aux.fresh_B & ~rows_B,
      start_B=jnp.where(rows_B, length_B, aux.start_B),
      written_B=jnp.where(rows_B, 0, aux.written_B),
      outer_B=where_keys(rows_B, state.rng_B, aux.outer_B))
  return start_canvas(model, aux, rows_B, c)


def append(forward: str, model, aux: CanvasRows, final_BxC, rows_B
           ) -> CanvasRows:
  """The finished canvases of rows_B written causally into the cache
  (their final K/V over the scratch ones), then the next canvas."""
  c = final_BxC.shape[1]
  slots = jnp.where(rows_B[:, None], aux.start_B[:, None] + jnp.arange(c),
                    -1)
  _, cache = FORWARDS[forward](
      model, model.params, model.config, final_BxC, slots, aux.cache,
      dg.causal(slots), logits=False)
  aux = aux.replace(cache=cache, start_B=aux.start_B + c * rows_B,
                    written_B=aux.written_B + c * rows_B)
  return start_canvas(model, aux, rows_B, c)
