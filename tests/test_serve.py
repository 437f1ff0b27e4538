"""The OpenAI-compatible server, as a real process on localhost, driven by
the official `openai` client and httpx (tiny model, Flash-dLLM, continuous
batching). The SIGTERM test is last: it stops the module's server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import time

import httpx
import numpy as np
import openai
import pytest

from flash_dllm_jax import generate, load
from flash_dllm_jax.generate import answer_ids
from flash_dllm_jax.sampling.row_sampling import Sampling
from flash_dllm_jax.strategies import build_sampler
from flash_dllm_jax.serve.protocol import MAX_LOGPROBS
from tests.paths import TINY_CHECKPOINT
from tests.serve_case import TINY_OPTIONS, Server, burst, offline, stream_raw

pytestmark = pytest.mark.slow  # one server start (compilation) per module


@pytest.fixture(scope="module", autouse=True)
def _emitters(default_emitters):
  """Log-probabilities equal generate's bit for bit under XLA's default
  emitters (tests/compile_level.py, fusion_emitters)."""
  yield


@pytest.fixture(scope="module")
def model():
  return load(TINY_CHECKPOINT)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
  srv = Server(TINY_CHECKPOINT, "flash-dllm", TINY_OPTIONS,
               "--batch-size", "4", "--max-prompt-tokens", "128",
               "--steps-per-call", "2", "--max-queue", "64",
               log_path=tmp_path_factory.mktemp("serve") / "server.log")
  try:
    health = srv.wait_ready()
    assert health["strategy"] == "flash-dllm" and health["batching"] == \
        "continuous" and health["prompt_len"] == 128
    assert health["slots"] == 4
    # the default: the automatic split (132 SMs where the device does not
    # tell, as on a CPU)
    tiling = health["attention_tiling"]
    assert (tiling["split_target"], tiling["group_target"]) == (132, 264)
    yield srv
  finally:
    srv.close()


def test_completion_chat_and_models(server):
  client = server.client()
  assert [m.id for m in client.models.list()] == ["tiny-random-llada"]
  c = client.completions.create(model="tiny-random-llada", prompt="2 + 3 =",
                                max_tokens=5)
  assert c.choices[0].finish_reason == "length"
  assert c.usage.completion_tokens == 5 == len(c.choices[0].token_ids)
  assert c.decoding["gen_length"] == 16 and c.decoding["strategy"] == \
      "flash-dllm" and c.usage.decode_steps >= 1
  chat = client.chat.completions.create(
      model="tiny-random-llada", messages=[{"role": "user", "content": "hi"}])
  assert chat.choices[0].message.role == "assistant"
  assert chat.usage.completion_tokens == len(chat.choices[0].token_ids) <= 16


def test_streaming_equals_whole_answer(server):
  client = server.client()
  kwargs = dict(model="tiny-random-llada",
                messages=[{"role": "user", "content": "count to ten"}])
  whole = client.chat.completions.create(**kwargs)
  chunks = list(client.chat.completions.create(**kwargs, stream=True))
  text = "".join(c.choices[0].delta.content or "" for c in chunks
                 if c.choices)
  assert text == whole.choices[0].message.content
  assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
      whole.choices[0].finish_reason
  assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_64_concurrent_requests_equal_offline_generate(server, model):
  _, config, tok = model
  sampler = build_sampler("flash-dllm", config.arch, TINY_OPTIONS)
  rng = np.random.default_rng(0)

  def row_of(ids, kind):  # the prompt ids the server decodes
    if kind == 2:
      return tok.encode(tok.decode(ids))
    if kind == 3:
      return tok.encode(tok.apply_chat_template(
          [{"role": "user", "content": tok.decode(ids)}]))
    return ids

  jobs, rows = [], []
  for i in range(64):  # 24 (every kind) pad to 64 offline, 40 to 128
    short = i % 16 in (0, 1, 2, 3, 9, 14)
    n = int(rng.integers(1, 56)) if short else int(rng.integers(72, 128))
    ids = [int(t) for t in rng.integers(0, config.vocab_size - 8, n)]
    while len(row_of(ids, i % 4)) > (64 if short else 128):
      ids = ids[:-8]
    rows.append(row_of(ids, i % 4))
    jobs.append({"ids": ids, "max_tokens": int(rng.integers(1, 17)),
                 "seed": int(rng.integers(0, 1000)), "kind": i % 4})

  def run(job):
    client = server.client()
    common = dict(model="tiny-random-llada", max_tokens=job["max_tokens"],
                  seed=job["seed"])
    if job["kind"] == 0:  # token ids, whole answer
      c = client.completions.create(prompt=job["ids"], **common)
      return c.choices[0].token_ids, c.choices[0].text
    if job["kind"] == 1:  # token ids, streamed
      ids = []
      deltas = stream_raw(server.url, {"prompt": job["ids"], "stream": True,
                                        **common}, ids)
      return ids, "".join(deltas)
    if job["kind"] == 2:  # text
      c = client.completions.create(prompt=tok.decode(job["ids"]), **common)
      return c.choices[0].token_ids, c.choices[0].text
    c = client.chat.completions.create(  # chat, strategy options stated
        messages=[{"role": "user", "content": tok.decode(job["ids"])}],
        extra_body={"decoding": {"block_m": 8, "threshold": 0.9}}, **common)
    return c.choices[0].token_ids, c.choices[0].message.content

  with concurrent.futures.ThreadPoolExecutor(64) as pool:
    got = list(pool.map(run, jobs))
  want = offline(model, sampler, rows, [j["seed"] for j in jobs],
                 [j["max_tokens"] for j in jobs])
  for i, ((ids, text), ref) in enumerate(zip(got, want)):
    assert ids == ref, f"request {i} ({jobs[i]})"
    assert text == tok.decode(ref), f"request {i} ({jobs[i]})"
  # One slot pool of 128 prompt positions; offline pads to 64 or 128 (24
  # rows of 64: the next test's offline program).
  assert [-(-len(r) // 64) for r in rows].count(1) == 24
  assert {-(-len(r) // 64) for r in rows} == {1, 2}


def test_per_request_sampling_and_n_equal_offline_generate(server, model):
  """Greedy and sampled requests (temperature, top_p, top_k, seed, n)
  decode together in the one compiled program; each choice equals offline
  generate with the same settings and seed (choice i: seed + i), 24 rows
  (the previous test's short rows' program)."""
  _, config, _ = model
  sampler = build_sampler("flash-dllm", config.arch, TINY_OPTIONS)
  rng = np.random.default_rng(1)
  settings = [dict(), dict(temperature=0.7), dict(temperature=1.0, top_p=0.8),
              dict(temperature=1.3, top_k=5), dict(temperature=0.9, top_p=0.9,
                                                   top_k=20)]
  jobs = []
  for i in range(12):
    ids = [int(t) for t in rng.integers(0, config.vocab_size - 8,
                                        int(rng.integers(1, 30)))]
    jobs.append({"ids": ids, "seed": int(rng.integers(0, 1000)),
                 "n": 1 + i % 3, "stream": i % 4 == 3,
                 **settings[i % len(settings)]})

  def run(job):
    body = {k: job[k] for k in ("temperature", "top_p") if k in job}
    extra = {"top_k": job["top_k"]} if "top_k" in job else {}
    common = dict(model="tiny-random-llada", prompt=job["ids"],
                  seed=job["seed"], n=job["n"], extra_body=extra, **body)
    client = server.client()
    if job["stream"]:
      ids = [[] for _ in range(job["n"])]
      for c in client.completions.create(stream=True, **common):
        for ch in c.choices:
          ids[ch.index] += ch.token_ids
      return ids
    c = client.completions.create(**common)
    assert [ch.index for ch in c.choices] == list(range(job["n"]))
    assert c.decoding["seed"] == job["seed"]
    assert c.decoding["sampling"]["temperature"] == job.get("temperature", 0)
    return [ch.token_ids for ch in c.choices]

  with concurrent.futures.ThreadPoolExecutor(12) as pool:
    got = list(pool.map(run, jobs))
  rows, seeds, sampling = [], [], []
  for job in jobs:
    for i in range(job["n"]):
      rows.append(job["ids"])
      seeds.append(job["seed"] + i)
      sampling.append(Sampling(**{k: job[k] for k in
                                  ("temperature", "top_p", "top_k")
                                  if k in job}))
  out = generate(model, rows, sampler=sampler, seed=seeds, sampling=sampling)
  want = [answer_ids(g, config) for g in out.tokens_BxG]
  flat = [ids for choices in got for ids in choices]
  assert flat == want and len(rows) == 24
  # sampling changed some answers (else the test would show nothing)
  greedy = generate(model, rows, sampler=sampler, seed=seeds)
  assert any(answer_ids(g, config) != w for g, w in zip(greedy.tokens_BxG,
                                                        want))


def test_per_request_gamma_equals_offline_generate(server, model):
  """decoding.gamma is row data: two requests with different Flash-Verify
  levels, sent at once to the one running server, each equal offline
  generate with that gamma as its row's (the logprobs test's program;
  tests/test_row_sampling.py: a row's gamma decodes what a sampler built
  with it decodes); the response reports the row's gamma."""
  _, config, _ = model
  sampler = build_sampler("flash-dllm", config.arch, TINY_OPTIONS)
  ids = [int(t) for t in np.random.default_rng(3).integers(0, 300, 12)]
  gammas = (0.5, 0.05)

  def run(gamma):
    c = server.client().completions.create(
        model="tiny-random-llada", prompt=ids, seed=4,
        extra_body={"decoding": {"gamma": gamma}})
    assert c.decoding["sampling"]["gamma"] == gamma
    assert c.decoding["options"]["gamma"] == 0.8  # the variant's own
    return c.choices[0].token_ids, c.usage.decode_steps

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    got = list(pool.map(run, gammas))
  out = generate(model, [ids, ids], sampler=sampler, seed=4, logprobs=True,
                 sampling=[Sampling(gamma=g) for g in gammas])
  for i, ((ids_got, steps), gamma) in enumerate(zip(got, gammas)):
    assert ids_got == answer_ids(out.tokens_BxG[i], config), gamma
    assert steps == out.steps_B[i], gamma
  assert got[0][1] != got[1][1]  # gamma made a difference


def test_logprobs_equal_offline_generate(server, model):
  """Each token's log-probability at its commit step: the completion and
  chat formats, whole and streamed, equal to generate(logprobs=True)."""
  _, config, tok = model
  sampler = build_sampler("flash-dllm", config.arch, TINY_OPTIONS)
  client = server.client()
  ids = [int(t) for t in np.random.default_rng(2).integers(0, 300, 20)]
  c = client.completions.create(model="tiny-random-llada", prompt=ids,
                                logprobs=0, seed=3, temperature=0.8, n=2)
  out = generate(model, [ids, ids], sampler=sampler, seed=[3, 4],
                 sampling=Sampling(temperature=0.8), logprobs=True)
  for i, ch in enumerate(c.choices):
    n = len(ch.token_ids)
    assert ch.token_ids == answer_ids(out.tokens_BxG[i], config)
    assert ch.logprobs.token_logprobs == [float(x) for x in
                                          out.logprobs_BxG[i][:n]]
    assert ch.logprobs.tokens == [tok.decode([t]) for t in ch.token_ids]
  kwargs = dict(model="tiny-random-llada", seed=5, logprobs=True,
                messages=[{"role": "user", "content": "add 2 and 2"}])
  whole = client.chat.completions.create(**kwargs)
  lps = [e.logprob for e in whole.choices[0].logprobs.content]
  assert len(lps) == len(whole.choices[0].token_ids) > 0
  # greedy: the argmax's probability is at least 1 / vocabulary size
  assert all(-np.log(config.vocab_size) <= lp <= 0 for lp in lps)
  chunks = list(client.chat.completions.create(**kwargs, stream=True))
  streamed = [e.logprob for ch in chunks if ch.choices and
              ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
  assert streamed == lps
  plain = client.chat.completions.create(**{**kwargs, "logprobs": False})
  assert plain.choices[0].logprobs is None
  # above the declared maximum of alternatives: a 400 naming the field
  r = httpx.post(server.url + "/v1/completions",
                 json={"model": "tiny-random-llada", "prompt": "x",
                       "logprobs": MAX_LOGPROBS + 1})
  assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
  r = httpx.post(server.url + "/v1/chat/completions",
                 json={**kwargs, "top_logprobs": MAX_LOGPROBS + 1})
  assert r.status_code == 400 and r.json()["error"]["param"] == \
      "top_logprobs" and str(MAX_LOGPROBS) in r.json()["error"]["message"]


def test_streaming_never_revises_text(server):
  bodies = [{"model": "tiny-random-llada", "prompt": f"story {i}:",
             "stream": True, "stop": ["zz"]} for i in range(8)]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    streams = list(pool.map(lambda b: stream_raw(server.url, b), bodies))
  client = server.client()
  for body, deltas in zip(bodies, streams):
    whole = client.completions.create(model=body["model"],
                                      prompt=body["prompt"], stop=["zz"])
    assert "".join(deltas) == whole.choices[0].text
  assert max(sum(1 for d in s if d) for s in streams) >= 2  # incremental
  assert server.metrics()["dllm_text_revisions_total"] == 0


def test_bad_requests_get_400_naming_the_field(server, model):
  config = model[1]
  client = server.client()
  cases = [({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 17}, "max_tokens"),
           ({"n": 17}, "n"), ({"temperature": 2.5}, "temperature"),
           ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"),
           ({"bogus": 1}, "bogus"),
           ({"decoding": {"threshold": 1.5}}, "decoding.threshold"),
           ({"decoding": {"gamma": 1.5}}, "decoding.gamma"),
           ({"decoding": {"gamma": "high"}}, "decoding.gamma"),
           ({"decoding": {"factor": 2.0}}, "decoding.factor"),
           ({"decoding": {"block_m": 4}}, "decoding.block_m"),
           ({"decoding": {"nope": 1}}, "decoding.nope"),
           ({"prompt": [config.mask_token_id, 5]}, "prompt"),
           ({"prompt": [5] * 129}, "prompt"), ({"prompt": [9999]}, "prompt"),
           ({"prompt": []}, "prompt")]
  for extra, param in cases:
    body = {"model": "tiny-random-llada", "prompt": "hi", **extra}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400, (extra, r.text)
    assert r.json()["error"]["param"] == param, (extra, r.text)
  r = httpx.post(server.url + "/v1/completions", content=b'{"model": "ti',
                 headers={"content-type": "application/json"})
  assert r.status_code == 400 and "malformed JSON" in r.json()["error"][
      "message"]
  with pytest.raises(openai.BadRequestError) as e:
    client.completions.create(model="tiny-random-llada", prompt="x",
                              max_tokens=100)
  assert e.value.body["param"] == "max_tokens"
  with pytest.raises(openai.NotFoundError):
    client.completions.create(model="gpt-4", prompt="x")


def test_deadline(server):
  r = httpx.post(server.url + "/v1/completions",
                 json={"model": "tiny-random-llada", "prompt": "slow",
                       "timeout": 1e-6})
  assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"


def test_overload_gets_429_and_nothing_is_lost(server):
  before = server.metrics()
  replies = asyncio.run(burst(server.url, 200, {"model": "tiny-random-llada",
                                                 "prompt": "load"}))
  codes = [r.status_code for r in replies]
  assert set(codes) <= {200, 429} and 429 in codes and 200 in codes
  assert all(r.headers["retry-after"] for r in replies if r.status_code == 429)
  texts = {r.json()["choices"][0]["text"] for r in replies
           if r.status_code == 200}
  assert len(texts) == 1  # the same prompt gets the same answer under load
  after = server.metrics()
  ok = 'dllm_requests_total{outcome=ok}'
  rejected = 'dllm_requests_total{outcome=rejected}'
  assert after[ok] - before[ok] == codes.count(200)
  assert after[rejected] - before[rejected] == codes.count(429)


def test_disconnect_frees_its_slot(server):
  before = server.metrics()
  body = {"model": "tiny-random-llada", "prompt": "busy"}
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    background = pool.submit(asyncio.run, burst(server.url, 40, body))
    time.sleep(0.2)  # the queue is full of work: the stream waits in it
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={"model": "tiny-random-llada", "stream": True,
                            "messages": [{"role": "user", "content": "x"}]},
                      timeout=60) as r:
      next(r.iter_lines())  # the role chunk: the request is in the queue
    replies = background.result()
  assert all(r.status_code == 200 for r in replies)
  for _ in range(100):
    m = server.metrics()
    if m["dllm_busy_slots"] == 0 and m["dllm_queue_length"] == 0:
      break
    time.sleep(0.1)
  key = 'dllm_requests_total{outcome=cancelled}'
  assert m[key] - before[key] == 1
  assert m["dllm_busy_slots"] == 0 and m["dllm_queue_length"] == 0


def test_metrics_parse(server):
  m = server.metrics()
  assert m["dllm_slots"] == 4  # one pool for both prompt buckets
  assert m["dllm_host_round_trips_total"] > 0
  assert m["dllm_generated_tokens_total"] > 0
  assert m["dllm_decode_steps_total"] >= m["dllm_host_round_trips_total"] / 8
  assert m["dllm_time_to_first_token_seconds_count"] > 0
  assert m["dllm_admission_latency_seconds_count"] > 0
  assert m["dllm_request_latency_seconds_count"] > 0


def test_sigterm_finishes_in_flight_then_exits(server):
  """Last: stops the module's server. Requests queued or decoding when
  SIGTERM arrives are answered; then the process exits 0."""
  body = {"model": "tiny-random-llada", "prompt": "term"}
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    background = pool.submit(asyncio.run, burst(server.url, 48, body))
    for _ in range(500):
      m = server.metrics()
      if m["dllm_queue_length"] > 0:
        break
      time.sleep(0.02)
    else:
      pytest.fail("the burst never queued")
    held = m["dllm_queue_length"] + m["dllm_busy_slots"]
    server.proc.send_signal(signal.SIGTERM)
    replies = background.result()
  codes = [r.status_code for r in replies]
  # what the server held is answered; what came after SIGTERM is refused
  assert codes.count(200) >= held and set(codes) <= {200, 503}, codes
  assert len({r.json()["choices"][0]["text"] for r in replies
              if r.status_code == 200}) == 1
  assert server.proc.wait(timeout=60) == 0
  with pytest.raises(httpx.TransportError):
    httpx.get(server.url + "/health", timeout=5)
