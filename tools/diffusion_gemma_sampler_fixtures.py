"""Builds tests/reference/diffusion_gemma/sampler_tokens.json: the tokens
google-deepmind/gemma's genuine diffusion sampler gives on the tiny
checkpoint (run by hand, outside CI, which cannot import that package):

  python tools/diffusion_gemma_sampler_fixtures.py --gemma /path/to/checkout

For each case (prompt ids, seed, sampler settings) it builds the official
`gemma.diffusion.Sampler` on the checkpoint in tests/reference/
diffusion_gemma/tiny (params restored with orbax, float32) and records
`sampler.sample(prompt, rng=seed, return_state=True).tokens`, alone, and
for one batch of prompts of different lengths also the official batched
answer (which differs from the alone answers: see the test). The
tokenizer is a stand-in over token ids ("5 17 33" -> [BOS, 5, 17, 33]);
no code of the package is copied here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent))  # this checkout's package
import gemma_official  # noqa: E402

REF = Path(__file__).parent.parent / "tests" / "reference" / "diffusion_gemma"

# Prompts (ids after BOS) of different lengths; the window of the tiny
# model is 4, so every canvas here is longer than it.
PROMPTS = ([17, 33, 5, 90, 121, 64, 8, 140, 77, 31, 12],
           [99, 23, 57],
           [61, 7, 150, 44, 44, 18, 101])
# (name, settings): official Sampler arguments in this engine's option
# names. The early-stop rules fire on this model only where its logits are
# sharpened (low temperatures) and the canvas is short: "chained" and
# "token_stability" stop within the step budget on most rows, "entropy:2.6"
# on all; "defaults" is the official default rule (which does not fire here).
CASES = (
    ("defaults", dict(canvas_length=8, max_denoising_steps=6,
                      max_out_length=24)),
    ("none", dict(canvas_length=6, max_denoising_steps=5, early_stop="none",
                  max_out_length=17, entropy_bound=0.5)),
    ("token_stability", dict(canvas_length=2, max_denoising_steps=10,
                             early_stop="token_stability", max_out_length=6,
                             entropy_bound=1e9, max_temperature=0.02,
                             min_temperature=0.005)),
    ("chained", dict(canvas_length=2, max_denoising_steps=10,
                     early_stop="chained", max_out_length=6,
                     entropy_bound=1e9, max_temperature=0.002,
                     min_temperature=0.0005)),
    ("entropy", dict(canvas_length=6, max_denoising_steps=8,
                     early_stop="entropy:2.6", max_out_length=18)),
    ("stop_tokens", dict(canvas_length=6, max_denoising_steps=4,
                         early_stop="none", max_out_length=30,
                         entropy_bound=1e9, stop_tokens=(20, 21, 22, 23, 24,
                                                          25, 26, 27, 28))),
)
SEEDS = (0, 7)


def _no_pep695(source: str) -> str:
  """`type X = ...` (Python 3.12) as a plain assignment."""
  return re.sub(r"^type (\w+) = ", r"\1 = ", source, flags=re.M)


class _Anything(types.ModuleType):
  """A module of placeholder classes (dependencies the text path only names)."""

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return type(name, (), {"__init__": lambda s, *a, **k: None,
                           "__class_getitem__": classmethod(lambda c, k: c)})


def import_sampler(root: Path):
  """The genuine gemma.diffusion modules (Sampler, early stops, models)."""
  gemma_official.import_official(
      root, transforms={"gemma.gm.text._sampler": _no_pep695})
  for name in ("chex", "dialog"):
    sys.modules.setdefault(name, _Anything(name))
  import kauldron
  kauldron.ktyping.check_type = lambda *a, **k: None
  kauldron.typing.PRNGKeyLike = object
  from gemma.gm.text import _sampler
  import gemma.gm as gm
  import gemma.gm.text as text
  text.Sampler, text.ChatSampler = _sampler.Sampler, object
  gm.text = text
  from gemma.diffusion import _chat_sampler, _early_stopping, _models
  from gemma.diffusion import _sampler as dsampler
  return types.SimpleNamespace(Sampler=_chat_sampler.Sampler,
                               stops=_early_stopping, models=_models,
                               d=dsampler)


class IdTokenizer:
  """Stand-in tokenizer: text is space-separated ids."""

  VERSION = 0
  FORBIDDEN_TOKENS = ()
  FORMAT = None

  def __init__(self, vocab_size: int, special_tokens):
    self.vocab_size, self.special_tokens = vocab_size, special_tokens

  def encode(self, text, add_bos: bool = False):
    ids = [int(t) for t in str(text).split()]
    return ([int(self.special_tokens.BOS)] if add_bos else []) + ids

  def decode(self, ids):
    return " ".join(str(int(i)) for i in np.asarray(ids).tolist())


def early_stop_fn(off, rule: str):
  if rule == "chained":
    return off.stops.ChainedEarlyStop(early_stop_fns=(
        off.stops.TokenStabilityEarlyStop(),
        off.stops.EntropyEarlyStop(entropy_threshold=0.005)))
  if rule == "token_stability":
    return off.stops.TokenStabilityEarlyStop()
  if rule == "none":
    return off.stops.NoEarlyStop()
  bound = float(rule.split(":", 1)[1])
  return off.stops.EntropyEarlyStop(entropy_threshold=bound)


def official_sampler(off, model, params, tokenizer, settings):
  s = dict(settings)
  shaper = off.d.AnnealingTemperatureShaperConfig(
      exponent=s.get("exponent", 1.0),
      max_temperature=s.get("max_temperature", 0.8),
      min_temperature=s.get("min_temperature", 0.4))
  return off.Sampler(
      model=model, params=params, tokenizer=tokenizer,
      canvas_length=s["canvas_length"],
      max_denoising_steps=s["max_denoising_steps"],
      logit_shaper=off.d.AnnealingTemperatureShaper(config=shaper),
      sample_from_predictions=off.d.SampleFromPredictions(
          entropy_bound=s.get("entropy_bound", 0.1)),
      early_stop_fn=early_stop_fn(off, s.get("early_stop", "chained")),
      stop_tokens=list(s.get("stop_tokens", ())) or None,
      max_out_length=s["max_out_length"], cache_length=512,
      pad_length=None)


def fingerprint(params) -> float:
  """Sum of |every parameter| (float64): names the checkpoint the tokens
  were made with."""
  return float(sum(np.abs(np.asarray(a, np.float64)).sum()
                   for a in jax.tree.leaves(params)))


def load_tiny(ckpt: Path):
  import orbax.checkpoint as ocp
  meta = json.loads((ckpt / "config.json").read_text())
  params = ocp.StandardCheckpointer().restore(ckpt.absolute())
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  return params, meta


def build(root: Path, ref: Path):
  off = import_sampler(root)
  sys.path.insert(0, str(Path(__file__).parent))
  from diffusion_gemma_fixtures import official_config
  params, meta = load_tiny(ref / "tiny")
  config = official_config(meta["transformer_config"])
  model = off.models.DiffusionGemma_26B_A4B(config=config, dtype=jnp.float32)
  from gemma.gm.text import _tokenizer
  tokenizer = IdTokenizer(config.num_embed, _tokenizer.SpecialTokens)
  bos = int(_tokenizer.SpecialTokens.BOS)
  text = lambda ids: " ".join(map(str, ids))
  cases = []
  for name, settings in CASES:
    sampler = official_sampler(off, model, params, tokenizer, settings)
    for seed in SEEDS:
      for prompt in PROMPTS:
        out = sampler.sample(text(prompt), rng=seed, return_state=True)
        cases.append(dict(case=name, settings=settings, seed=seed,
                          prompt=[bos] + prompt,
                          tokens=np.asarray(out.tokens).tolist()))
        print(name, seed, len(prompt), cases[-1]["tokens"])
  name, settings = CASES[0]
  sampler = official_sampler(off, model, params, tokenizer, settings)
  out = sampler.sample([text(p) for p in PROMPTS], rng=SEEDS[0],
                       return_state=True)
  batch = dict(case=name, settings=settings, seed=SEEDS[0],
               prompts=[[bos] + p for p in PROMPTS],
               tokens=np.asarray(out.tokens).tolist())
  data = dict(source="google-deepmind/gemma gemma.diffusion.Sampler "
              "(pad_length=None, cache_length=512)", checkpoint="tiny",
              params_fingerprint=fingerprint(params), cases=cases,
              official_batch=batch)
  path = ref / "sampler_tokens.json"
  path.write_text(json.dumps(data, indent=None, separators=(",", ":"))
                  + "\n")
  return data


def check_sampler(root: Path, ref: Path) -> int:
  """Decodes every stored case with this engine's `diffusion-gemma` loop
  around the OFFICIAL model (its Flax forward behind the slot interface of
  diffusion_gemma/model.py), alone and in one batch per setting; returns
  how many rows differ from the official sampler's tokens. This isolates
  the sampler: on the near-uniform tiny model a 1-ulp difference in the
  forward changes the trajectory (the self-conditioning is rounded to
  bfloat16 each step), so CI, which runs the engine's own forward, checks
  official tokens on a decisive setting only."""
  off = import_sampler(root)
  from diffusion_gemma_fixtures import official_config
  from gemma.diffusion import _transformer
  from flash_dllm_jax.architectures.diffusion_gemma import model as dg
  from flash_dllm_jax.architectures.diffusion_gemma import sampler as smod
  from flash_dllm_jax.architectures.diffusion_gemma.config import (
      GemmaConfig)
  params, meta = load_tiny(ref / "tiny")
  config = official_config(meta["transformer_config"])
  model = off.models.DiffusionGemma_26B_A4B(config=config, dtype=jnp.float32)

  def empty_cache(cfg, b, n, dtype=None):
    return config.init_cache(batch_size=b, dtype=jnp.float32,
                             cache_length=512)

  def forward_one(tokens, slots, cache, last, sc, logits):
    """One row (unpadded): the official cache writes at end_index on."""
    start = jnp.maximum(slots[:, 0], 0)
    cache = {k: {**v, "end_index": start} for k, v in cache.items()}
    mask = jnp.arange(512)[None, None, :] <= last[:, :, None]
    pos = jnp.maximum(slots, 0)
    if sc is None:
      out = model.apply({"params": params}, tokens=tokens, cache=cache,
                        positions=pos, attention_mask=mask)
    else:
      out = model.apply(
          {"params": params}, tokens=tokens, sc_embeddings=sc, cache=cache,
          positions=pos, attention_mask=mask, sliding_attention_mask=mask,
          method=_transformer.DiffusionMixin.call_with_self_conditioning)
    return out.logits, out.cache

  def forward(params_, cfg, tokens, slots, cache, last, sc=None,
              logits=True):
    if tokens.shape[0] != 1:
      raise ValueError("the check decodes one row at a time")
    return forward_one(tokens, slots, cache, last, sc, logits)

  def encode_logits(params_, cfg, x):
    return model.apply({"params": params},
                       x, method=lambda self, y: self.embedder.encode_logits(y))

  smod.dg = types.SimpleNamespace(
      forward=forward, forward_rows=forward, empty_cache=empty_cache,
      encode_logits=encode_logits,
      causal=dg.causal, canvas=dg.canvas)
  gconfig = GemmaConfig.from_official(meta["transformer_config"],
                                      meta["special_tokens"],
                                      dtype="float32")
  from flash_dllm_jax.generate import decode_jit
  data = json.loads((ref / "sampler_tokens.json").read_text())
  bad = 0
  for c in data["cases"]:
    # A batch of one with no padding: the prompt's prefill then multiplies
    # the same shapes as the official one (XLA:CPU's matmul bits depend on
    # the number of rows).
    ids = jnp.asarray([c["prompt"]], jnp.int32)
    key = jax.vmap(jax.random.key)(jnp.asarray([c["seed"]], jnp.uint32))
    sampler = smod.DiffusionGemmaSampler(**c["settings"])
    got = decode_jit(params, ids, ids > 0, key, None, config=gconfig,
                     sampler=sampler)[0]
    same = np.asarray(got)[0].tolist() == c["tokens"]
    bad += not same
    print(c["case"], c["seed"], len(c["prompt"]),
          "same" if same else "DIFFERS", flush=True)
  return bad


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gemma", required=True,
                      help="a google-deepmind/gemma checkout (holds gemma/)")
  parser.add_argument("--ref", default=str(REF),
                      help="the folder holding tiny/ (written to)")
  parser.add_argument("--check-sampler", action="store_true",
                      help="instead: decode the stored cases with this "
                      "engine's sampler around the official model")
  args = parser.parse_args(argv)
  if not args.check_sampler:
    # The engine's CPU decode runs without XLA:CPU's YNNPACK fusions
    # (flash_dllm_jax/compilation.py: its own compiler options); the
    # official sampler is recorded under the same setting (set before JAX
    # starts its backend), else the two programs differ in the last bits
    # of a reduction, which a near-uniform tiny model's trajectory
    # (self-conditioning rounded to bfloat16 every step) amplifies.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_experimental_ynn_fusion_type=")
  if args.check_sampler:
    bad = check_sampler(Path(args.gemma), Path(args.ref))
    print(f"{bad} rows differ from the official sampler")
    sys.exit(1 if bad else 0)
  build(Path(args.gemma), Path(args.ref))
  print(f"wrote {Path(args.ref) / 'sampler_tokens.json'}")


if __name__ == "__main__":
  main()
