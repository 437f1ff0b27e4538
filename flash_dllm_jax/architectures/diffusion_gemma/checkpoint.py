"""Google's DiffusionGemma checkpoints: the orbax parameter tree that
gm.ckpts.load_params reads (the nested `model.init()['params']` tree
written by `orbax.checkpoint.StandardCheckpointer().save(DIR, params)`, as
gm.ckpts.save_params does; a Kauldron checkpoint's `default/` item and
`params` subtree too), with its config from DIR/config.json
({"transformer_config": TransformerConfig fields, "special_tokens":
{"eos": ..}, optional "text_vocab_size", "max_seq_len", "dtype"}) or, without that
file, from the built-in preset whose shapes the stored tree has.

Text only: the vision and audio parameters a checkpoint may hold are
dropped. `load` checks every text parameter against the config's shapes.
A Hugging Face DiffusionGemma directory loads too (hf.py), and converts
to this format (`convert`, what scripts/convert_hf.py runs; `save` writes
it: checkpoint_save.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util
from jax.sharding import NamedSharding

from flash_dllm_jax import parallel
from flash_dllm_jax import quantize as qlib
from flash_dllm_jax.architectures.diffusion_gemma import checkpoint_save
from flash_dllm_jax.architectures.diffusion_gemma import hf as hf_format
from flash_dllm_jax.architectures.diffusion_gemma.config import (
    GEMMA4_SPECIAL, PRESETS, GemmaConfig, preset)
from flash_dllm_jax.architectures.diffusion_gemma.quant import quantize_tree
from flash_dllm_jax.architectures.diffusion_gemma.tokenizer import (
    load_tokenizer)

# Writing, in checkpoint_save.py; the family's loader module names both.
save, convert = checkpoint_save.save, checkpoint_save.convert

_ORBAX_MARKERS = ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt")
_MM_TOP = ("vision_encoder", "audio_encoder")


def _config_json(ckpt_dir: Path) -> dict[str, Any] | None:
  path = ckpt_dir / "config.json"
  if not path.is_file():
    return None
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON: {e}") from None


def _is_orbax(ckpt_dir: Path) -> bool:
  return any((ckpt_dir / m).exists() for m in _ORBAX_MARKERS) or (
      ckpt_dir / "default" / "_METADATA").exists()


def claims(ckpt_dir) -> bool:
  """Whether `ckpt_dir` is a Google-format DiffusionGemma checkpoint: a
  config.json with "transformer_config", or an orbax tree without this
  engine's manifest.json and without a config.json."""
  d = Path(ckpt_dir)
  if not d.is_dir() or (d / "manifest.json").is_file():
    return False
  hf = _config_json(d)
  if hf is not None:
    return "transformer_config" in hf or hf_format.is_hf_dir(d)
  return _is_orbax(d)


def _item_dir(ckpt_dir: Path) -> Path:
  """The directory of the params item (a Kauldron checkpoint's default/)."""
  if not (ckpt_dir / "_METADATA").exists() and (
      ckpt_dir / "default" / "_METADATA").exists():
    return ckpt_dir / "default"
  return ckpt_dir


def _restore_on_host(item: Path) -> dict:
  """The orbax tree as host arrays, whatever devices wrote it: a tree saved
  from TPUs, GPUs or another CPU topology names devices this process may
  not have, which orbax's own restore (to the saved sharding) refuses."""
  checkpointer = ocp.PyTreeCheckpointer()
  meta = checkpointer.metadata(item)
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                      tree, is_leaf=lambda x: hasattr(x, "shape"))
  return checkpointer.restore(
      item, args=ocp.args.PyTreeRestore(restore_args=args))


def _stored_shapes(item: Path) -> dict[str, tuple[int, ...]]:
  meta = ocp.StandardCheckpointer().metadata(item)
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  if isinstance(tree, dict) and "params" in tree and "embedder" not in tree:
    tree = tree["params"]  # a Kauldron training state
  flat = traverse_util.flatten_dict(dict(tree), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()
          if hasattr(v, "shape")}


def param_shapes(config: GemmaConfig) -> dict[str, tuple[int, ...]]:
  """{'/'-joined path: shape} of every text parameter of `config`'s model
  in the official tree."""
  d, v = config.d_model, config.vocab_size
  out = {"embedder/input_embedding": (v, d), "final_norm/scale": (d,),
         "self_conditioner/pre_norm/scale": (d,),
         "self_conditioner/ffw/gating_einsum": (2, config.sc_width, d),
         "self_conditioner/ffw/linear": (config.sc_width, d)}
  for i, kind in enumerate(config.layer_kinds):
    p = f"layer_{i}/"
    kv, h = config.kv_heads(kind), config.key_size(kind)
    out[p + "attn/q_einsum/w"] = (config.n_heads, d, h)
    out[p + "attn/attn_vec_einsum/w"] = (config.n_heads, h, d)
    if config.k_eq_v(kind):
      out[p + "attn/k_einsum/w"] = (kv, d, h)
    else:
      out[p + "attn/kv_einsum/w"] = (2, kv, d, h)
    if config.qk_norm_with_scale:
      out[p + "attn/query_norm/scale"] = (h,)
      out[p + "attn/key_norm/scale"] = (h,)
    norms = ["pre_attention_norm", "pre_ffw_norm"]
    norms += ["post_attention_norm"] * config.use_post_attn_norm
    norms += ["post_ffw_norm"] * config.use_post_ffw_norm
    out[p + "skip_scale"] = (1,)
    dense = "mlp2" if config.moe_experts else "mlp"
    out[p + f"{dense}/gating_einsum"] = (2, config.mlp_hidden, d)
    out[p + f"{dense}/linear"] = (config.mlp_hidden, d)
    if config.moe_experts:
      x, m = config.moe_experts, config.moe_hidden
      norms += ["pre_ffw2_norm"]
      norms += ["post_ffw1_norm", "post_ffw2_norm"] * config.use_post_ffw_norm
      out[p + "mlp/router_logits/w"] = (d, x)
      out[p + "mlp/router_scale"] = (d,)
      out[p + "mlp/per_expert_scale"] = (x,)
      out[p + "mlp/gating_einsum/w"] = (x, 2, m, d)
      out[p + "mlp/linear/w"] = (x, m, d)
    for n in norms:
      out[p + f"{n}/scale"] = (d,)
  return out


def _text_only(shapes: dict) -> dict:
  return {k: s for k, s in shapes.items()
          if k.split("/")[0] not in _MM_TOP and not (
              k.startswith("embedder/") and k != "embedder/input_embedding")}


def load_config(ckpt_dir, dtype: str | None = None) -> GemmaConfig:
  """The GemmaConfig of a Google-format checkpoint directory."""
  d = Path(ckpt_dir)
  if hf_format.is_hf_dir(d):
    return hf_format.load_config(d, dtype)
  meta = _config_json(d)
  changes = {} if dtype is None else {"dtype": dtype}
  if meta is not None:
    if "transformer_config" not in meta:
      raise ValueError(f"{d}/config.json has no \"transformer_config\"")
    for key in ("text_vocab_size", "max_seq_len", "dtype"):
      if key in meta:
        changes.setdefault(key, meta[key])
    try:
      return GemmaConfig.from_official(
          meta["transformer_config"],
          {**GEMMA4_SPECIAL, **meta.get("special_tokens", {})}, **changes)
    except KeyError as e:
      raise ValueError(f"{d}/config.json: transformer_config lacks "
                       f"{e.args[0]!r}") from None
  stored = _text_only(_stored_shapes(_item_dir(d)))
  for name in PRESETS:
    config = preset(name, **changes)
    if param_shapes(config) == stored:
      return config
  raise ValueError(f"{d} has no config.json and its parameters match no "
                   f"built-in preset ({', '.join(PRESETS)}); add a "
                   "config.json with \"transformer_config\"")


def check_shapes(config: GemmaConfig, shapes: dict, where: str) -> None:
  """One ValueError naming what the stored tree lacks or has wrong."""
  want, have = param_shapes(config), _text_only(shapes)
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
  if missing or extra or wrong:
    parts = []
    if missing:
      parts.append(f"missing {missing[:3]}{' ...' * (len(missing) > 3)}")
    if extra:
      parts.append(f"unexpected {extra[:3]}{' ...' * (len(extra) > 3)}")
    if wrong:
      k = wrong[0]
      parts.append(f"{k} has shape {have[k]}, the config says {want[k]}"
                   + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1
                      else ""))
    raise ValueError(f"{where} does not match its config: "
                     + "; ".join(parts))


def load(ckpt_dir, dtype: str | None = None, mesh=None,
         quantize: str | None = None, quantize_head: bool = False,
         quantize_embedding: bool = False, fuse_qkv: bool | None = None):
  """(params: the official nested tree, text only, cast to `dtype` if
  given; GemmaConfig, whose dtype is `dtype` or the stored one; the
  directory's tokenizer.json or None: tokenizer.py). quantize: the
  projections stored in that 8-bit format as they
  load (quant.py; the config records it). mesh ('data=D,model=M' or a
  Mesh): each weight goes from host memory straight onto its shards
  (config.param_roles), one array at a time."""
  d = Path(ckpt_dir)
  if quantize_head or quantize_embedding:
    raise ValueError("DiffusionGemma keeps its tied embedding unquantized: "
                     "quantize_head and quantize_embedding are not supported")
  if quantize is not None:
    qlib.get_format(quantize)
    params, config, tok = load(d, dtype=dtype, mesh=mesh)
    return (quantize_tree(params, config, quantize),
            config.replace(quantize=quantize), tok)
  mesh = parallel.parse_mesh(mesh)
  if hf_format.is_hf_dir(d):
    params, config = hf_format.load(d, dtype)
    parallel.check_config(config, mesh)
    tok, config = load_tokenizer(d, config)
    flat = traverse_util.flatten_dict(dict(params), sep="/")
    return traverse_util.unflatten_dict(
        {k: _placed(config, k, v, mesh) for k, v in flat.items()},
        sep="/"), config, tok
  config = load_config(d, dtype)
  parallel.check_config(config, mesh)
  tok, config = load_tokenizer(d, config)
  item = _item_dir(d)
  check_shapes(config, _stored_shapes(item), str(d))
  tree = _restore_on_host(item)
  if "params" in tree and "embedder" not in tree:
    tree = tree["params"]
  flat = traverse_util.flatten_dict(dict(tree), sep="/")
  keep = param_shapes(config)
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  out = {k: _placed(config, k, np.asarray(v, np_dtype), mesh)
         for k, v in flat.items() if k in keep}
  stored = str(out["embedder/input_embedding"].dtype)
  if dtype is None and stored in ("bfloat16", "float32"):
    config = config.replace(dtype=stored)  # computed as stored
  return traverse_util.unflatten_dict(out, sep="/"), config, tok


def _placed(config, path: str, array, mesh):
  """`array` (host) on one device, or on its shards of `mesh`."""
  if mesh is None:
    return jnp.asarray(array)
  spec = parallel.param_spec(config, path, array.shape, mesh)
  return jax.device_put(array, NamedSharding(mesh, spec))


def init_params(config: GemmaConfig, rng: jax.Array, dtype=None):
  """Random parameters of `config`'s shapes (benchmarks, tests): weights
  ~N(0, 1/fan_in), scales 1."""
  dtype = jnp.dtype(dtype or config.dtype)
  shapes = param_shapes(config)
  keys = jax.random.split(rng, len(shapes))
  out = {}
  for key, (path, shape) in zip(keys, sorted(shapes.items())):
    if len(shape) == 1:
      out[path] = jnp.ones(shape, dtype)
    else:
      fan_in = shape[-1] if "gating" in path or "q_einsum" in path else (
          shape[-2] if len(shape) > 1 else 1)
      out[path] = (jax.random.normal(key, shape, jnp.float32)
                   / np.sqrt(fan_in)).astype(dtype)
  return traverse_util.unflatten_dict(out, sep="/")
