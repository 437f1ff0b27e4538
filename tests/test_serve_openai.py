"""What OpenAI and vLLM clients send by default, against a real server
(tiny model, Flash-dLLM) through the official `openai` client: stop
strings with usage, the fields and routes vLLM takes, several prompts per
completions request, echo with the prompt's log-likelihood, fresh seeds."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pydantic
import pytest

from flash_dllm_jax import likelihood, load
from tests.paths import TINY_CHECKPOINT
from tests.serve_case import TINY_OPTIONS, Server

pytestmark = pytest.mark.slow  # one server start (compilation) per module


@pytest.fixture(scope="module", autouse=True)
def _emitters(default_emitters):
  """Log-probabilities equal generate's bit for bit under XLA's default
  emitters (tests/compile_level.py, fusion_emitters)."""
  yield
MODEL = "tiny-random-llada"


@pytest.fixture(scope="module")
def model():
  return load(TINY_CHECKPOINT)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  # test_serve_faults.py's engine settings (its plain program is compiled
  # once per run); the alternatives' program on top.
  srv = Server(TINY_CHECKPOINT, "flash-dllm", TINY_OPTIONS,
               "--batch-size", "4", "--max-prompt-tokens", "64",
               "--steps-per-call", "2", "--max-logprobs", "20",
               log_path=tmp_path_factory.mktemp("serve") / "server.log")
  try:
    srv.wait_ready()
    yield srv
  finally:
    srv.close()


def _post(server, route, body):
  return httpx.post(server.url + route, json=body, timeout=300)


def test_a_stop_string_cuts_text_ids_logprobs_and_usage(server):
  client = server.client()
  kwargs = dict(model=MODEL, prompt="tell me a story about", seed=7,
                max_tokens=16, logprobs=0)
  full = client.completions.create(**kwargs).choices[0]
  text = full.text
  stop = next(text[k:k + 3] for k in range(2, len(text) - 3)
              if text[k:k + 3].strip())
  got = client.completions.create(**kwargs, stop=[stop])
  ch = got.choices[0]
  assert ch.text == text[:text.index(stop)] and ch.finish_reason == "stop"
  k = len(ch.token_ids)
  assert ch.token_ids == full.token_ids[:k] and k < len(full.token_ids)
  assert got.usage.completion_tokens == k
  assert ch.logprobs.token_logprobs == full.logprobs.token_logprobs[:k]
  tokenizer = load(TINY_CHECKPOINT)[2]
  assert stop in tokenizer.decode(ch.token_ids)  # the token completing it
  assert stop not in tokenizer.decode(ch.token_ids[:-1])
  chunks = list(client.completions.create(**kwargs, stop=[stop],
                                          stream=True))
  assert "".join(c.choices[0].text for c in chunks if c.choices) == ch.text
  assert [t for c in chunks if c.choices for t in c.choices[0].token_ids] \
      == ch.token_ids
  assert [x for c in chunks if c.choices and c.choices[0].logprobs
          for x in c.choices[0].logprobs.token_logprobs] == \
      ch.logprobs.token_logprobs
  assert chunks[-1].usage.completion_tokens == k


def test_fields_clients_send_by_default(server):
  client = server.client()
  base = dict(model=MODEL, seed=3, max_tokens=8)
  plain = client.chat.completions.create(
      **base, messages=[{"role": "system", "content": "be brief"},
                        {"role": "user", "content": "hello there"}])
  parts = client.chat.completions.create(
      **base, presence_penalty=0, frequency_penalty=0.0, top_logprobs=0,
      metadata={"who": "test"},
      messages=[{"role": "developer", "content": "be brief"},
                {"role": "user", "content": [
                    {"type": "text", "text": "hello "},
                    {"type": "text", "text": "there"}]}])
  assert parts.choices[0].token_ids == plain.choices[0].token_ids
  c = client.completions.create(**base, prompt="x", best_of=2, n=2)
  assert [ch.index for ch in c.choices] == [0, 1]
  refused = [
      ("/v1/chat/completions", {"presence_penalty": 0.5}, "presence_penalty"),
      ("/v1/completions", {"frequency_penalty": -1}, "frequency_penalty"),
      ("/v1/completions", {"suffix": "end"}, "suffix"),
      ("/v1/completions", {"best_of": 3}, "best_of"),
      ("/v1/completions", {"decoding": {"seed": 1}}, "decoding.seed"),
      ("/v1/completions", {"decoding": {"temperature": 0.5}},
       "decoding.temperature"),
      ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
          {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
       "messages.0.content.0")]
  for route, extra, param in refused:
    body = {"model": MODEL, "prompt": "x",
            "messages": [{"role": "user", "content": "x"}], **extra}
    body.pop("messages" if route == "/v1/completions" else "prompt")
    r = _post(server, route, body)
    assert r.status_code == 400, (extra, r.text)
    assert r.json()["error"]["param"] == param, r.text
  assert "request's temperature" in _post(server, "/v1/completions", {
      "model": MODEL, "prompt": "x", "decoding": {"temperature": 0.5}}).json()[
          "error"]["message"]
  assert "llada family takes text only" in _post(
      server, refused[-1][0], {"model": MODEL, **refused[-1][1]}).json()[
          "error"]["message"]


def test_several_prompts_each_their_own_rows_in_order(server):
  client = server.client()
  prompts = ["one two", "three four five", "six"]
  got = client.completions.create(model=MODEL, prompt=prompts, n=2, seed=11,
                                  max_tokens=6)
  assert [c.index for c in got.choices] == list(range(6))
  for p, prompt in enumerate(prompts):
    alone = client.completions.create(model=MODEL, prompt=prompt, n=2,
                                      seed=11, max_tokens=6)
    for j in range(2):
      assert got.choices[p * 2 + j].token_ids == alone.choices[j].token_ids
      assert got.choices[p * 2 + j].text == alone.choices[j].text
  assert got.usage.completion_tokens == sum(len(c.token_ids)
                                            for c in got.choices)
  assert got.usage.prompt_tokens == sum(
      _post(server, "/tokenize", {"prompt": p}).json()["count"]
      for p in prompts)
  r = _post(server, "/v1/completions", {"model": MODEL,
                                        "prompt": [[5], [99999]]})
  assert r.status_code == 400 and r.json()["error"]["param"] == "prompt.1"


def test_echo_logprobs_are_the_adapters_log_likelihood(server, model):
  """lm-eval's local-completions body; its own parser reads the answer."""
  from lm_eval.models.openai_completions import LocalCompletionsAPI
  params, config, tokenizer = model
  ids = tokenizer.encode("The capital of France is Paris")
  body = {"model": MODEL, "prompt": [ids], "temperature": 0,
          "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
  r = _post(server, "/v1/completions", body)
  assert r.status_code == 200, r.text
  choice = r.json()["choices"][0]
  lp = choice["logprobs"]
  assert choice["text"].startswith(tokenizer.decode(ids))
  assert len(lp["token_logprobs"]) == len(ids) + 1
  assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
  # each prompt token: the adapter's estimator for that one-token
  # continuation after the tokens before it
  reqs = [likelihood.Request(ids[:j], [ids[j]], np.ones((1, 1), bool),
                             np.ones(1)) for j in range(1, len(ids))]
  want, _ = likelihood.estimate_many(params, config, reqs, batch_size=8)
  np.testing.assert_allclose(lp["token_logprobs"][1:len(ids)], want,
                             rtol=1e-5, atol=1e-5)
  for own, top in zip(lp["token_logprobs"][1:len(ids)],
                      lp["top_logprobs"][1:len(ids)]):
    assert len(top) == 1 and max(top.values()) >= own - 1e-6
  ctx = 3
  (total, greedy), = LocalCompletionsAPI.parse_logprobs(r.json(),
                                                        ctxlens=[ctx])
  assert total == pytest.approx(float(np.sum(want[ctx - 1:])), abs=1e-4)
  assert isinstance(greedy, bool)
  # streamed: the prompt (and its log-probs) comes first
  chunks = list(server.client().completions.create(**{**body,
                                                      "stream": True}))
  assert chunks[0].choices[0].text == tokenizer.decode(ids)
  assert chunks[0].choices[0].logprobs.token_logprobs == \
      lp["token_logprobs"][:len(ids)]


def _check_alternatives(entries, k):
  """Chat logprobs entries: k alternatives each, likeliest first; the
  chosen token's entry (where among them) carries its own log-prob."""
  hits = 0
  for e in entries:
    values = [a.logprob for a in e.top_logprobs]
    assert len(values) == k and values == sorted(values, reverse=True)
    own = [a.logprob for a in e.top_logprobs if a.token == e.token]
    if own:
      hits += 1
      assert e.logprob in own
    else:
      assert e.logprob <= values[-1]
  return hits


def test_top_logprobs_of_generated_tokens(server):
  """Each generated token's alternatives at the step that committed it, in
  chat and completions, streamed or not; the answer and its log-probs
  are those decoded without them."""
  client = server.client()
  chat = dict(model=MODEL, seed=11, max_tokens=12, temperature=0.8,
              logprobs=True,
              messages=[{"role": "user", "content": "name three colours"}])
  plain = client.chat.completions.create(**chat).choices[0]
  got = client.chat.completions.create(**chat, top_logprobs=4).choices[0]
  assert got.token_ids == plain.token_ids and got.token_ids
  assert [e.logprob for e in got.logprobs.content] == \
      [e.logprob for e in plain.logprobs.content]
  assert all(e.top_logprobs == [] for e in plain.logprobs.content)
  assert _check_alternatives(got.logprobs.content, 4) > 0
  chunks = list(client.chat.completions.create(**chat, top_logprobs=4,
                                               stream=True))
  streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
              for e in c.choices[0].logprobs.content]
  assert [(e.token, e.logprob, [(a.token, a.logprob) for a in e.top_logprobs])
          for e in streamed] == \
      [(e.token, e.logprob, [(a.token, a.logprob) for a in e.top_logprobs])
       for e in got.logprobs.content]
  # completions: logprobs=k, {token: log-prob} per position
  kwargs = dict(model=MODEL, prompt="tell me a story about", seed=7,
                max_tokens=16)
  base = client.completions.create(**kwargs, logprobs=0).choices[0]
  two = client.completions.create(**kwargs, logprobs=2).choices[0]
  assert two.token_ids == base.token_ids
  lp = two.logprobs
  assert lp.token_logprobs == base.logprobs.token_logprobs
  assert len(lp.top_logprobs) == len(two.token_ids)
  for own, top in zip(lp.token_logprobs, lp.top_logprobs):
    assert 1 <= len(top) <= 2 and own <= max(top.values())
  chunks = list(client.completions.create(**kwargs, logprobs=2,
                                          stream=True))
  assert [t for c in chunks if c.choices and c.choices[0].logprobs
          for t in c.choices[0].logprobs.top_logprobs] == lp.top_logprobs
  with pytest.raises(openai.BadRequestError, match="top_logprobs"):
    client.chat.completions.create(**chat, top_logprobs=21)


def test_no_seed_draws_a_fresh_one_that_reproduces_the_answer(server):
  client = server.client()
  kwargs = dict(model=MODEL, prompt="pick a number", temperature=1.0,
                max_tokens=16)
  a, b = (client.completions.create(**kwargs) for _ in range(2))
  assert a.decoding["seed"] != b.decoding["seed"]
  again = client.completions.create(**kwargs, seed=a.decoding["seed"])
  assert again.choices[0].token_ids == a.choices[0].token_ids


def test_models_tokenize_detokenize_version(server):
  client = server.client()
  card = client.models.retrieve(MODEL)
  assert card.id == MODEL and card.max_model_len == 64 + 16
  assert client.models.list().data[0].max_model_len == 64 + 16
  with pytest.raises(openai.NotFoundError):
    client.models.retrieve("gpt-4")
  tok = _post(server, "/tokenize", {"model": MODEL, "prompt": "hello world",
                                    "return_token_strs": True}).json()
  assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"]) > 0
  assert tok["max_model_len"] == 80
  back = _post(server, "/detokenize", {"tokens": tok["tokens"]}).json()
  assert back["prompt"] == "hello world"
  chat = _post(server, "/tokenize", {"messages": [
      {"role": "user", "content": "hello world"}]}).json()
  assert chat["count"] > tok["count"]
  assert _post(server, "/detokenize", {"tokens": [-1]}).status_code == 400
  assert httpx.get(server.url + "/version").json()["version"]


class Answer(pydantic.BaseModel):
  ok: bool  # '{"ok": false}' is 11 tokens of the tiny model's 16


def test_structured_output_is_always_valid_json(server):
  """The openai client's structured-output helper: every answer parses
  under the schema, greedy or sampled, whatever the random model prefers."""
  client = server.client()
  for seed in range(3):
    got = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "how are you"}],
        response_format=Answer, temperature=1.0, seed=seed)
    ch = got.choices[0]
    assert ch.finish_reason == "stop" and isinstance(ch.message.parsed,
                                                     Answer)
    assert got.usage.decode_steps <= got.usage.completion_tokens
  obj = client.chat.completions.create(
      model=MODEL, messages=[{"role": "user", "content": "data"}],
      max_tokens=16, response_format={"type": "json_object"})
  text = obj.choices[0].message.content
  if obj.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(text), dict)
  else:  # the canvas ran out first: a prefix of an object
    assert text.startswith("{")
  r = _post(server, "/v1/chat/completions", {
      "model": MODEL, "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {
          "name": "x", "schema": {"type": "object", "properties": {
              "a": {"$ref": "#/nowhere"}}}}}})
  assert r.status_code == 400 and r.json()["error"]["param"] == \
      "response_format", r.text
