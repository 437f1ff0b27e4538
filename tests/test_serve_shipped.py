"""The server on the shipped model: LLaDA's sampler at temperature > 0
(batch admission, per-request seeds), 16 concurrent chat and completion
requests, each equal to offline `generate` with the settings it reports;
per-request temperatures and logprobs in the same server."""

from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest

from flash_dllm_jax import load
from flash_dllm_jax.cli import DEFAULT_CHECKPOINT
from flash_dllm_jax.generate import answer_ids, generate
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.strategies import build_sampler
from tests.compile_level import full_optimisation_env
from tests.serve_case import Server

# The shipped model's decodes compute more than they compile: XLA's default
# level for the decode loops here and for the server.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("optimised")]

OPTIONS = {"gen_length": 16, "steps": 8, "block_length": 8,
           "temperature": 0.5}
NAME = DEFAULT_CHECKPOINT.name


@pytest.fixture(scope="module")
def model():
  return load(DEFAULT_CHECKPOINT)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  srv = Server(DEFAULT_CHECKPOINT, "llada", OPTIONS, "--batch-size", "8",
               "--max-prompt-tokens", "128",
               log_path=tmp_path_factory.mktemp("serve") / "server.log",
               env=full_optimisation_env())
  try:
    health = srv.wait_ready()
    assert health["batching"] == "batch"
    yield srv
  finally:
    srv.close()


def test_16_concurrent_requests_equal_offline_generate(server, model):
  """16 requests at once through the server's 8 slots: two rounds of batch
  admission (the second queued behind the first), each answer equal to the
  shipped model's offline one."""
  _, config, tok = model
  sampler = build_sampler("llada", config.arch, OPTIONS)
  rng = np.random.default_rng(1)
  jobs = []
  for i in range(16):
    a, b = (int(x) for x in rng.integers(2, 90, 2))
    question = [f"{a} + {b} =",
                f"Tom has {a} apples and buys {b} more. How many apples "
                f"does he have now?",
                f"A farm has {a} cows and {b} sheep. Each cow eats 3 kg of "
                f"hay a day. How much hay do the cows eat in a week?"
                ][i % 3]
    jobs.append({"text": question, "chat": i % 2 == 0,
                 "seed": int(rng.integers(0, 2**31)),
                 "max_tokens": int(rng.integers(4, 17))})

  def run(job):
    client = server.client()
    common = dict(model=NAME, max_tokens=job["max_tokens"], seed=job["seed"],
                  temperature=0.5)
    if job["chat"]:
      c = client.chat.completions.create(
          messages=[{"role": "user", "content": job["text"]}], **common)
      assert c.decoding["options"]["temperature"] == 0.5
      return c.choices[0].token_ids, c.choices[0].message.content
    c = client.completions.create(prompt=job["text"], **common)
    return c.choices[0].token_ids, c.choices[0].text

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    got = list(pool.map(run, jobs))
  rows = [tok.encode(tok.apply_chat_template(
      [{"role": "user", "content": j["text"]}])) if j["chat"]
          else tok.encode(j["text"]) for j in jobs]
  # Offline pads these prompts to 64; the slots pad them to 128.
  assert max(len(r) for r in rows) <= 64
  # offline in two batches of 8 with their logprobs: the next test's
  # program
  out = generate(model, rows, sampler=sampler, seed=[j["seed"] for j in jobs],
                 batch_size=8, sampling=[None] * len(rows), logprobs=True)
  want = [answer_ids(g, config)[:j["max_tokens"]]
          for g, j in zip(out.tokens_BxG, jobs)]
  for i, ((ids, text), ref) in enumerate(zip(got, want)):
    assert ids == ref, f"request {i} ({jobs[i]})"
    assert text == tok.decode(ref), f"request {i}"
  # the seeds matter: the same prompt under two seeds differs somewhere
  assert len({tuple(ids) for ids, _ in got}) > 1


def test_per_request_temperature_seed_and_logprobs_equal_offline(server,
                                                                 model):
  """temperature is each request's own row data (the sampler's 0.5 where a
  request states none): requests with different temperatures and seeds in
  the one running server each equal offline generate with those settings,
  logprobs included; LLaDA takes no top_p and no decoding.temperature."""
  _, config, tok = model
  sampler = build_sampler("llada", config.arch, OPTIONS)
  temps = [None, 0.0, 0.9, 1.4, 0.5, 1.1, 0.7, None]  # the 8 slots
  prompts = [f"{3 + i} + {7 * i} =" for i in range(len(temps))]

  def run(i):
    kw = {} if temps[i] is None else {"temperature": temps[i]}
    c = server.client().completions.create(
        model=NAME, prompt=prompts[i], seed=10 + i, logprobs=0, **kw)
    assert c.decoding["sampling"]["temperature"] == (
        0.5 if temps[i] is None else temps[i])
    return c.choices[0].token_ids, c.choices[0].logprobs.token_logprobs

  with concurrent.futures.ThreadPoolExecutor(len(temps)) as pool:
    got = list(pool.map(run, range(len(temps))))
  rows = [tok.encode(p) for p in prompts]
  seeds = [10 + i for i in range(len(temps))]
  out = generate(model, rows, sampler=sampler, seed=seeds, logprobs=True,
                 sampling=[None if t is None else Sampling(temperature=t)
                           for t in temps])
  for i, (ids, lps) in enumerate(got):
    assert ids == answer_ids(out.tokens_BxG[i], config), i
    assert lps == [float(x) for x in out.logprobs_BxG[i][:len(ids)]], i
  greedy = generate(model, rows, sampler=sampler, seed=seeds,
                    sampling=Sampling(), logprobs=True)  # out's program
  assert any((g != w).any() for g, w in zip(greedy.tokens_BxG,
                                            out.tokens_BxG))
  for extra, param in [({"top_p": 0.9}, "top_p"),
                       ({"decoding": {"temperature": 0.7}},
                        "decoding.temperature")]:
    r = httpx.post(server.url + "/v1/completions",
                   json={"model": NAME, "prompt": "1 + 1 =", **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
