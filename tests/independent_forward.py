"""A from-scratch forward with an arbitrary attention mask, for tests only.

Written directly from the LLaDA/Dream equations over the Flax param tree
(no model code), so cached or pattern-masked passes can be checked against
an uncached computation of the same attention pattern.
"""

import jax
import jax.numpy as jnp
import numpy as np

HI = jax.lax.Precision.HIGHEST


def _rms(x, w, eps):
  return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


def _rope(x_BxNxHxD, pos_BxN, theta):
  d = x_BxNxHxD.shape[-1]
  inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float32) / d)
  ang = pos_BxN[..., None].astype(jnp.float32) * inv
  ang = jnp.concatenate([ang, ang], -1)[:, :, None, :]
  rot = jnp.concatenate([-x_BxNxHxD[..., d // 2:], x_BxNxHxD[..., :d // 2]], -1)
  return x_BxNxHxD * jnp.cos(ang) + rot * jnp.sin(ang)


def forward(params, config, tokens_BxN, positions_BxN, attend_BxNxN, rows_BxR):
  """Logits [B, R, V] (float32) of rows, row i attending to key j iff
  attend_BxNxN[b, i, j]."""
  c = config
  p32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  mm = lambda a, w: jnp.einsum("bne,eo->bno", a, w, precision=HI)
  b, n = tokens_BxN.shape
  x = p32["embed"][tokens_BxN]
  for layer in range(c.n_layers):
    p = p32[f"layers_{layer}"]
    h = _rms(x, p["attn_norm"]["scale"], c.rms_norm_eps)
    proj = lambda n: mm(h, p[n]["kernel"]) + (p[n]["bias"] if "bias" in p[n] else 0)
    q = proj("q_proj").reshape(b, n, c.n_heads, c.head_dim)
    k = proj("k_proj").reshape(b, n, c.n_kv_heads, c.head_dim)
    v = proj("v_proj").reshape(b, n, c.n_kv_heads, c.head_dim)
    q, k = _rope(q, positions_BxN, c.rope_theta), _rope(k, positions_BxN, c.rope_theta)
    g = c.n_heads // c.n_kv_heads
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bnhd,bshd->bhns", q, k, precision=HI) / np.sqrt(c.head_dim)
    s = jnp.where(attend_BxNxN[:, None], s, -jnp.inf)
    a = jax.nn.softmax(s, -1)
    o = jnp.einsum("bhns,bshd->bnhd", a, v, precision=HI).reshape(b, n, -1)
    x = x + mm(o, p["attn_out"]["kernel"])
    h = _rms(x, p["mlp_norm"]["scale"], c.rms_norm_eps)
    x = x + mm(jax.nn.silu(mm(h, p["gate_proj"]["kernel"]))
               * mm(h, p["up_proj"]["kernel"]), p["down_proj"]["kernel"])
  x = jnp.take_along_axis(x, rows_BxR[..., None], 1)
  x = _rms(x, p32["final_norm"]["scale"], c.rms_norm_eps)
  return mm(x, p32["lm_head"])


def verify_pass(params, config, tokens_BxN, positions_BxN, valid_BxN,
                slots_BxQ, tokens_BxQ, exclude_BxS, inq_BxQxQ, rows_BxR):
  """Logits [B, R, V] of verify rows (indices into Q), computed uncached on
  the extended sequence [context N | verify rows Q].

  The context is a plain forward of tokens_BxN (what a complete cache
  holds). Verify row r sits at the RoPE position of slot slots_BxQ[r] (-1 =
  unused) and sees the valid context outside exclude_BxS plus verify row c
  iff inq_BxQxQ[r, c]; no row sees itself unless inq_BxQxQ says so (Dream's
  predictor rows do not). Nothing flows from verify rows to the context.
  """
  b, n = tokens_BxN.shape
  q = slots_BxQ.shape[1]
  real_BxQ = slots_BxQ >= 0
  tokens_ext = jnp.concatenate([tokens_BxN, tokens_BxQ], 1)
  pos_ext = jnp.concatenate([positions_BxN, jnp.take_along_axis(
      positions_BxN, jnp.maximum(slots_BxQ, 0), 1)], 1)
  ctx_ok_BxN = valid_BxN & ~exclude_BxS
  attend = jnp.zeros((b, n + q, n + q), bool)
  attend = attend.at[:, :n, :n].set(valid_BxN[:, None, :])
  attend = attend.at[:, n:, :n].set(real_BxQ[:, :, None] & ctx_ok_BxN[:, None])
  attend = attend.at[:, n:, n:].set(inq_BxQxQ)
  # rows of unused slots see key 0 (no empty softmax)
  attend = attend.at[:, n:, 0].set(attend[:, n:, 0] | ~real_BxQ)
  return forward(params, config, tokens_ext, pos_ext, attend, n + rows_BxR)
