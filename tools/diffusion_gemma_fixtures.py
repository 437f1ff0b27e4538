"""Builds tests/reference/diffusion_gemma/ from google-deepmind/gemma's
genuine code (run by hand, outside CI, which cannot fetch that package):

  python tools/diffusion_gemma_fixtures.py --gemma /path/to/gemma-checkout

writes
  tiny/            a tiny DiffusionGemma checkpoint in Google's format: the
                   params tree of a randomly initialised official model
                   saved by orbax's StandardCheckpointer (what
                   gm.ckpts.save_params does), plus config.json with its
                   TransformerConfig fields ("transformer_config") and
                   special ids ("special_tokens")
  forward.npz      inputs and the official model's outputs (float32) for
                   the calls the official sampler makes: a plain causal
                   forward (a padded row), a causal prefill into a KV cache,
                   denoising forwards of a canvas with self-conditioning
                   (zero and non-zero signal) against the cached prompt,
                   the causal append of a finished canvas, a second canvas
                   after it, and Embedder.encode_logits.

The tiny config has local and global layers, a window smaller than the
canvas and the prompt, K=V global layers with their own key size and kv
heads, partial RoPE, an MoE beside the dense shared MLP, a logit softcap.
Parameters are redrawn at unit-ish scale (the official init's 0.01 normal
would make every logit ~0 and the comparison empty).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gemma_official  # noqa: E402

OUT = Path(__file__).parent.parent / "tests" / "reference" / "diffusion_gemma"
PATTERN = ("LOCAL_SLIDING", "LOCAL_SLIDING", "GLOBAL")
TINY = dict(
    num_embed=160, embed_dim=32, hidden_dim=48, num_heads=4, head_dim=8,
    num_kv_heads=2, final_logit_softcap=8.0, use_post_attn_norm=True,
    use_post_ffw_norm=True, attention_types=PATTERN * 2,
    attn_logits_soft_cap=None, sliding_window_size=4,
    qk_norm_with_scale=True, num_global_kv_heads=1, global_key_size=16,
    k_eq_v_global=True, global_rope_proportion=0.25,
    local_rope_proportion=1.0, local_base_frequency=10_000,
    global_base_frequency=1_000_000, enable_moe=True, num_experts=4,
    expert_dim=16, top_k_experts=2, moe_dense_hidden_dim=48)
# The Gemma 4 tokenizer's ids where the tiny vocabulary has them.
SPECIAL = dict(pad=0, eos=1, bos=2, unk=3, mask=4, start_of_turn=105,
               end_of_turn=106, begin_of_tool_response=50)
PROMPT, CANVAS, CACHE = 7, 6, 32


def official_config(fields):
  from gemma.gm.nn.gemma4 import _config, _modules
  kinds = tuple(_modules.AttentionType[k] for k in fields["attention_types"])
  return _config.TransformerConfig(**{**fields, "attention_types": kinds})


def redraw(params, rng):
  """Each leaf drawn again: weights ~N(0, 1/fan_in), norm scales 1+-0.3."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(rng, len(leaves))
  out = []
  for (path, leaf), key in zip(leaves, keys):
    name = jax.tree_util.keystr(path)
    noise = jax.random.normal(key, leaf.shape, jnp.float32)
    if leaf.ndim <= 1:  # norm scales, skip/expert/router scales
      out.append(1.0 + 0.3 * noise)
    elif "input_embedding" in name:
      out.append(noise)
    else:
      fan_in = leaf.size // leaf.shape[-1] if "attn_vec" in name else (
          leaf.shape[-1] if "gating" in name or "q_einsum" in name
          or "k_einsum" in name or "kv_einsum" in name else leaf.shape[-2])
      out.append(noise * (1.0 / np.sqrt(max(fan_in, 1))) * 1.5)
  return jax.tree_util.tree_unflatten(treedef, out)


def causal_mask(end, length, cache_length):
  """[B, length, cache_length]: cache entries below `end` plus a causal
  block written at end..end+length (the sampler's append mask)."""
  idx = jnp.arange(cache_length)
  old = idx[None, None, :] < end[:, None, None]
  rows = end[:, None] + jnp.arange(length)[None, :]
  new = (idx[None, None, :] >= end[:, None, None]) & (
      idx[None, None, :] <= rows[:, :, None])
  return old | new


def canvas_masks(end, length, cache_length, window):
  """The denoising forward's global mask (everything valid plus the whole
  canvas) and block-local mask (the window before the canvas, the canvas)."""
  idx = jnp.arange(cache_length)[None, :]
  total = jnp.minimum(end + length, cache_length)
  glob = idx < total[:, None]
  start = jnp.maximum(end - window, 0)
  local = ((idx >= start[:, None]) & (idx < end[:, None])) | (
      (idx >= end[:, None]) & (idx < total[:, None]))
  shape = (end.shape[0], length, cache_length)
  return (jnp.broadcast_to(glob[:, None], shape),
          jnp.broadcast_to(local[:, None], shape))


def build(root: Path, out_dir: Path, seed: int = 0):
  gemma_official.import_official(root)
  from gemma.diffusion import _models, _transformer
  import orbax.checkpoint as ocp

  config = official_config(TINY)
  model = _models.DiffusionGemma_26B_A4B(config=config, dtype=jnp.float32)
  rng = jax.random.PRNGKey(seed)
  tokens = jax.random.randint(rng, (2, PROMPT), 5, TINY["num_embed"])
  params = model.init(rng, tokens)["params"]
  sc_init = model.init(rng, tokens, sc_embeddings=jnp.zeros(
      (2, PROMPT, TINY["embed_dim"])),
      method=_transformer.DiffusionMixin.call_with_self_conditioning)
  params = {**params, **sc_init["params"]}
  params = redraw(params, jax.random.PRNGKey(seed + 1))
  apply = lambda **kw: model.apply({"params": params}, **kw)
  sc_apply = lambda **kw: model.apply(
      {"params": params},
      method=_transformer.DiffusionMixin.call_with_self_conditioning, **kw)
  data = {}

  # 1. Plain causal forward; row 1 right-padded with PAD (0).
  plain = np.array(jax.random.randint(jax.random.PRNGKey(2), (2, 9), 5,
                                        TINY["num_embed"]))
  plain[1, 6:] = 0
  data["plain_tokens"] = plain
  data["plain_logits"] = apply(tokens=jnp.asarray(plain)).logits

  # 2. Causal prefill of two prompts of PROMPT tokens into a CACHE-long
  #    cache (slots 0 .. PROMPT - 1, end_index PROMPT).
  cache = config.init_cache(batch_size=2, dtype=jnp.float32,
                            cache_length=CACHE)
  prompt = jax.random.randint(jax.random.PRNGKey(3), (2, PROMPT), 5,
                              TINY["num_embed"])
  end = jnp.zeros((2,), jnp.int32)
  positions = end[:, None] + jnp.arange(PROMPT)[None, :]
  mask = causal_mask(end, PROMPT, CACHE)
  out = apply(tokens=prompt, cache=cache, positions=positions,
              attention_mask=mask)
  data.update(prefill_tokens=prompt, prefill_positions=positions,
              prefill_mask=mask, prefill_logits=out.logits)
  cache = out.cache

  # 3. Denoising forwards of a canvas: zero then non-zero self-conditioning.
  def denoise(cache, canvas, sc, tag):
    end = cache["layer_0"]["end_index"]
    positions = end[:, None] + jnp.arange(CANVAS)[None, :]
    glob, local = canvas_masks(end, CANVAS, CACHE,
                               TINY["sliding_window_size"])
    o = sc_apply(tokens=canvas, sc_embeddings=sc, cache=cache,
                 positions=positions, attention_mask=glob,
                 sliding_attention_mask=local)
    data.update({f"{tag}_tokens": canvas, f"{tag}_positions": positions,
                 f"{tag}_mask": glob, f"{tag}_local_mask": local,
                 f"{tag}_sc": sc, f"{tag}_logits": o.logits})
    return o

  canvas = jax.random.randint(jax.random.PRNGKey(4), (2, CANVAS), 5,
                              TINY["num_embed"])
  zero = jnp.zeros((2, CANVAS, TINY["embed_dim"]), jnp.float32)
  first = denoise(cache, canvas, zero, "step0")
  sc = model.apply({"params": params}, first.logits / 0.7,
                   method=lambda self, x: self.embedder.encode_logits(x))
  data.update(encode_in=first.logits / 0.7, encode_out=sc)
  denoise(cache, canvas[:, ::-1], sc, "step1")

  # 4. Causal append of the finished canvas, then a second canvas.
  end = cache["layer_0"]["end_index"]
  positions = end[:, None] + jnp.arange(CANVAS)[None, :]
  mask = causal_mask(end, CANVAS, CACHE)
  out = apply(tokens=canvas, cache=cache, positions=positions,
              attention_mask=mask)
  data.update(append_tokens=canvas, append_positions=positions,
              append_mask=mask, append_logits=out.logits)
  cache = out.cache
  for i, (name, layer) in enumerate(sorted(cache.items())):
    if i in (0, 2):  # a local and a global layer's cache after the append
      for key in ("k", "v", "positions", "end_index"):
        data[f"cache_{name}_{key}"] = layer[key]
  canvas2 = jax.random.randint(jax.random.PRNGKey(5), (2, CANVAS), 5,
                               TINY["num_embed"])
  denoise(cache, canvas2, sc * 0.5, "step2")

  ckpt = out_dir / "tiny"
  if ckpt.exists():
    shutil.rmtree(ckpt)
  out_dir.mkdir(parents=True, exist_ok=True)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(ckpt.absolute(), params)
  checkpointer.wait_until_finished()
  (ckpt / "commit_success.txt").unlink(missing_ok=True)  # names a local path
  (ckpt / "config.json").write_text(json.dumps(
      {"transformer_config": TINY, "special_tokens": SPECIAL}, indent=1)
      + "\n")
  np.savez_compressed(out_dir / "forward.npz",
                      **{k: np.asarray(v) for k, v in data.items()})
  return params, data


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gemma", required=True,
                      help="a google-deepmind/gemma checkout (holds gemma/)")
  parser.add_argument("--out", default=str(OUT))
  args = parser.parse_args(argv)
  build(Path(args.gemma), Path(args.out))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
