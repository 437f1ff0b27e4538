"""Sampler variants declared at start and `--mesh`: a real server process
over two (forced) CPU devices, `--mesh data=2`, three Flash-dLLM variants,
`--temperature` / `--top-k` as the requests' defaults; concurrent requests
pick variants by their stated options and each answer equals offline
generate with the settings the response reports."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import httpx
import numpy as np
import pytest

from flash_dllm_jax import architectures, generate, load
from flash_dllm_jax.generate import answer_ids
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.serve.cli_variants import default_strategy, parse_variant
from flash_dllm_jax.strategies import STRATEGIES, build, build_sampler, decodes
from tests.paths import TINY_CHECKPOINT
from tests.serve_case import TINY_OPTIONS, Server, stream_raw

VARIANTS = {1: {"block_m": 4}, 2: {"gen_length": 8}}
# serve --temperature / --top-k: flash-dllm samples per row, so they are
# the defaults of requests that set no temperature / top_k
DRAWS = {**TINY_OPTIONS, "temperature": 0.9, "top_k": 20}


def test_parse_variant_types_and_errors():
  assert parse_variant("threshold=0.6, gen-length=8,eos_tail=true", 1) == {
      "threshold": 0.6, "gen_length": 8, "eos_tail": True}
  for spec, needle in [("threshold", "KEY=VALUE"), ("nope=1", "'nope'"),
                       ("verify=false", "'verify'"),  # fixed by the strategy
                       ("gen_length=x", "gen_length takes a int"),
                       ("eos_tail=maybe", "eos_tail takes a bool")]:
    with pytest.raises(ValueError, match=needle):
      parse_variant(spec, 2)


def test_serve_without_a_strategy_decodes_every_family():
  """serve's strategy when none is given: flash-dllm where it decodes the
  family, else the family's own (what generate picks; the LLaDA2
  checkpoint gets llada2), buildable with no options. A server started so
  answers in tests/test_serve_diffusion_gemma.py."""
  for arch in architectures.names():
    name = default_strategy(arch)
    assert decodes(STRATEGIES[name], arch), (arch, name)
    assert name in ("flash-dllm", architectures.get(arch).default_strategy)
    build(name, arch, {})
  assert default_strategy("llada2") == "llada2"
  assert default_strategy("llada") == "flash-dllm"


@pytest.fixture(scope="module")
def model():
  return load(TINY_CHECKPOINT)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("serve")
  srv = Server(TINY_CHECKPOINT, "flash-dllm", DRAWS,
               "--batch-size", "4", "--max-prompt-tokens", "32",
               "--steps-per-call", "2", "--mesh", "data=2",
               "--variant", "block_m=4", "--variant", "gen_length=8",
               "--attention-split-target", "32",  # the batch-32 tiling
               "--compile-cache", str(tmp / "cache"),
               log_path=tmp / "server.log",
               env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
  try:
    health = srv.wait_ready()
    assert [v["block_m"] for v in health["variants"]] == [8, 4, 8]
    assert [v["gen_length"] for v in health["variants"]] == [16, 16, 8]
    assert health["mesh"] == {"data": 2, "model": 1}
    tiling = health["attention_tiling"]
    assert (tiling["split_target"], tiling["group_target"]) == (32, None)
    # --compile-cache: the decode loops compiled at start are on disk, so a
    # restarted server loads them.
    cached = os.listdir(tmp / "cache")
    assert any(e.startswith("jit__cycle") for e in cached), cached
    yield srv
  finally:
    srv.close()


@pytest.mark.slow
def test_concurrent_variants_equal_offline_generate(server, model):
  """Every answer equals offline generate with its variant's sampler and
  its row's settings: its own threshold / gamma, and the server's
  temperature 0.9 and top_k 20 unless it states temperature 0 (greedy);
  the draws changed some answers."""
  _, config, _ = model
  rng = np.random.default_rng(1)
  jobs = []
  # 30: every variant x (its stated options | the row's own) x (streamed |
  # the client), queued through the server's 4 slots
  for i in range(30):
    v = i % 3
    ids = [int(t) for t in rng.integers(0, config.vocab_size - 8,
                                        int(rng.integers(1, 33)))]
    # threshold and gamma are the row's own: any value, any variant
    decoding = {0: {"threshold": 0.9, "gamma": 0.3},
                1: {"block_m": 4, "threshold": 0.6},
                2: {"gen_length": 8, "gamma": 0.1}}[v] if i % 2 else \
        ({} if v == 0 else VARIANTS[v])
    jobs.append({"ids": ids, "seed": int(rng.integers(0, 1000)),
                 "variant": v, "decoding": decoding, "stream": i % 5 == 0,
                 "greedy": i % 4 == 1})

  def run(job):
    own = {"temperature": 0.0} if job["greedy"] else {}
    if job["stream"]:  # through httpx
      ids = []
      stream_raw(server.url, {"model": "tiny-random-llada", "stream": True,
                               "prompt": job["ids"], "seed": job["seed"],
                               "decoding": job["decoding"], **own}, ids)
      return ids, None
    client = server.client()
    c = client.completions.create(
        model="tiny-random-llada", prompt=job["ids"], seed=job["seed"],
        extra_body={"decoding": job["decoding"]} if job["decoding"] else None,
        **own)
    return c.choices[0].token_ids, c.decoding

  with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
    got = list(pool.map(run, jobs))
  drawn = 0
  for v in range(3):
    mine = [i for i, j in enumerate(jobs) if j["variant"] == v]
    options = {**TINY_OPTIONS, **VARIANTS.get(v, {})}
    sampler = build_sampler("flash-dllm", config.arch, options)
    rows = [{k: jobs[i]["decoding"].get(k) for k in ("threshold", "gamma")}
            for i in mine]
    draws = [{"temperature": 0.0} if jobs[i]["greedy"] else
             {"temperature": 0.9, "top_k": 20} for i in mine]
    kw = dict(sampler=sampler, seed=[jobs[i]["seed"] for i in mine])
    out = generate(model, [jobs[i]["ids"] for i in mine], **kw,
                   sampling=[Sampling(**r, **d) for r, d in zip(rows, draws)])
    greedy = generate(model, [jobs[i]["ids"] for i in mine], **kw,
                      sampling=[Sampling(**r) for r in rows])  # out's program
    for i, gen, plain in zip(mine, out.tokens_BxG, greedy.tokens_BxG):
      ids, decoding = got[i]
      assert ids == answer_ids(gen, config), f"request {i} ({jobs[i]})"
      if jobs[i]["greedy"]:
        assert ids == answer_ids(plain, config), f"request {i}"
      else:
        drawn += ids != answer_ids(plain, config)
      if decoding is not None:
        assert decoding["variant"] == v and decoding["seed"] == \
            jobs[i]["seed"] and decoding["options"] == dataclasses.asdict(
                sampler)
        assert decoding["sampling"]["gamma"] == jobs[i]["decoding"].get(
            "gamma")
        assert decoding["sampling"]["temperature"] == (
            0.0 if jobs[i]["greedy"] else 0.9)
  assert drawn > 0  # the server's draws changed some answers
  assert sum(d is None for _, d in got) == 6  # streamed
  assert sum(j["greedy"] for j in jobs) >= 6


@pytest.mark.slow
def test_undeclared_options_get_400_listing_the_allowed(server):
  cases = [({"decoding": {"block_m": 2}}, "decoding.block_m", "4, 8"),
           ({"decoding": {"gen_length": 8, "block_m": 4}},
            "decoding.block_m", "allowed: 8"),
           ({"decoding": {"threshold": 1.5}}, "decoding.threshold",
            "(0, 1]"),
           ({"decoding": {"gamma": 0}}, "decoding.gamma", "(0, 1]"),
           ({"max_tokens": 12, "decoding": {"gen_length": 8}}, "max_tokens",
            "gen_length 8")]
  for extra, param, needle in cases:
    body = {"model": "tiny-random-llada", "prompt": [5, 6], **extra}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400, (extra, r.text)
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"], (
        extra, error)
