"""Hostile and malformed requests against a real `serve` process on
localhost: the official client for what it sends (ints past int32, strings
and booleans for numbers), and hypothesis over the request schema (httpx,
for what the client never sends). No input gets a 500 or a hang, and the
server keeps answering (/health ready, a plain request served)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.paths import TINY_CHECKPOINT
from tests.serve_case import TINY_OPTIONS, Server

pytestmark = pytest.mark.slow  # one server start (compilation) per module
MODEL = "tiny-random-llada"
TIMEOUT = 60.0  # an answer slower than this is a hang


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  # test_serve_faults.py's engines: compiled once per run.
  srv = Server(TINY_CHECKPOINT, "flash-dllm", TINY_OPTIONS,
               "--batch-size", "4", "--max-prompt-tokens", "64",
               "--steps-per-call", "2",
               log_path=tmp_path_factory.mktemp("serve") / "server.log")
  try:
    srv.wait_ready()
    yield srv
  finally:
    srv.close()


def still_serving(server) -> None:
  health = httpx.get(server.url + "/health", timeout=TIMEOUT)
  assert health.status_code == 200 and health.json()["status"] == "ready"
  c = server.client().completions.create(model=MODEL, prompt=[5, 6],
                                         max_tokens=2)
  assert c.usage.completion_tokens == 2


CLIENT_CASES = [  # (create() arguments, the field the 400 names)
    ({"extra_body": {"top_k": 2**31}}, "top_k"),
    ({"extra_body": {"top_k": 2**63}}, "top_k"),
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": "nan"}, "temperature"),
    ({"n": "2"}, "n"),
    ({"seed": 2**32}, "seed"),
    ({"max_tokens": 2**70}, "max_tokens"),
    ({"extra_body": {"timeout": "5"}}, "timeout"),
    ({"extra_body": {"timeout": 1e6}}, "timeout"),
    ({"extra_body": {"decoding": {"gamma": "0.5"}}}, "decoding.gamma"),
    ({"extra_body": {"decoding": {"block_m": True}}}, "decoding.block_m"),
    ({"presence_penalty": "0"}, "presence_penalty"),
    ({"best_of": "2"}, "best_of"),
    ({"echo": "true"}, "echo"),
    ({"extra_body": {"metadata": {"a": 1}}}, "metadata.a"),
    ({"extra_body": {"response_format": {"type": "json_object", "x": 1}}},
     "response_format.x"),
]


@pytest.mark.parametrize("kwargs,param", CLIENT_CASES)
def test_the_official_client_gets_400s(server, kwargs, param):
  with pytest.raises(openai.BadRequestError) as e:
    server.client().completions.create(model=MODEL, prompt="hi",
                                       **{"max_tokens": 2, **kwargs})
  if param is not None:
    assert e.value.body["param"] == param, e.value.body


def test_a_top_k_past_the_vocabulary_is_every_token(server):
  """int32 but past the vocabulary: decodes as top_k off."""
  c = server.client()
  a = c.completions.create(model=MODEL, prompt=[5, 6], max_tokens=4,
                           temperature=1.0, seed=3,
                           extra_body={"top_k": 2**31 - 1})
  b = c.completions.create(model=MODEL, prompt=[5, 6], max_tokens=4,
                           temperature=1.0, seed=3, extra_body={"top_k": 0})
  assert a.choices[0].token_ids == b.choices[0].token_ids
  still_serving(server)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**80, 2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
NUMBERS = (st.integers(-2**70, 2**70) | st.floats(-1e30, 1e30)
           | st.sampled_from([0, 1, -1, 2**31, 2**32, 0.5, 1e-9]))
FIELDS = {  # each field: values near and past its range, and any JSON
    "max_tokens": NUMBERS, "temperature": NUMBERS, "top_p": NUMBERS,
    "top_k": NUMBERS, "seed": NUMBERS, "n": st.integers(-3, 20),
    "timeout": NUMBERS, "logprobs": NUMBERS, "stream": st.booleans(),
    "stop": st.lists(st.text(max_size=3), max_size=5) | JSON,
    "decoding": st.dictionaries(st.sampled_from(
        ["threshold", "gamma", "block_m", "gen_length", "temperature",
         "unknown"]), NUMBERS | JSON, max_size=2),
    "prompt": (st.lists(st.integers(-5, 2**33), min_size=0, max_size=70)
               | st.text(max_size=20) | JSON),
    # the OpenAI / vLLM fields beyond the sampler's (openai_fields.py)
    "echo": st.booleans(), "best_of": NUMBERS, "suffix": st.text(max_size=4),
    "presence_penalty": NUMBERS, "frequency_penalty": NUMBERS,
    "repetition_penalty": NUMBERS,
    "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4),
                                max_size=2),
}
RESPONSE_FORMATS = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "json_object", "json_schema"]) | JSON},
    optional={"json_schema": st.fixed_dictionaries(
        {}, optional={"name": st.text(max_size=4) | JSON,
                      "schema": st.just({"type": "integer"}) | JSON})
              | JSON})
FIELDS["response_format"] = RESPONSE_FORMATS
BODIES = st.fixed_dictionaries(
    {"model": st.just(MODEL),
     "prompt": st.just([5, 6]) | FIELDS["prompt"]},
    optional={k: v | JSON for k, v in FIELDS.items() if k != "prompt"})


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(body=BODIES)
def test_no_request_gets_a_500_or_a_hang(server, body):
  r = httpx.post(server.url + "/v1/completions", content=json.dumps(body),
                 headers={"content-type": "application/json"},
                 timeout=TIMEOUT)
  if r.status_code == 504:  # a timeout it asked for (a tiny one)
    assert r.json()["error"]["code"] == "timeout"
    return
  assert r.status_code < 500, (body, r.status_code, r.text[:300])
  if r.status_code != 200:
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


PARTS = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url"]) | JSON},
    optional={"text": st.text(max_size=6) | JSON}), max_size=2)
MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer", "assistant",
                              "tool"]) | JSON,
     "content": st.text(max_size=12) | PARTS | JSON}), max_size=3) | JSON
CHATS = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": MESSAGES},
    optional={"max_completion_tokens": NUMBERS | JSON,
              "logprobs": st.booleans() | JSON,
              "top_logprobs": NUMBERS | JSON, "temperature": NUMBERS | JSON,
              "top_k": NUMBERS | JSON,
              "presence_penalty": NUMBERS | JSON,
              "response_format": RESPONSE_FORMATS | JSON})


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(body=CHATS)
def test_no_chat_request_gets_a_500_or_a_hang(server, body):
  r = httpx.post(server.url + "/v1/chat/completions",
                 content=json.dumps(body),
                 headers={"content-type": "application/json"},
                 timeout=TIMEOUT)
  assert r.status_code < 500, (body, r.status_code, r.text[:300])


def test_after_the_hostile_inputs_the_server_still_serves(server):
  still_serving(server)


def test_settings_and_serve_flags_hold_their_dtypes():
  """What the compiled loop stores as int32, and finite timeouts."""
  from flash_dllm_jax.serve.service import Settings
  for bad, why in [(dict(steps_per_call=2**32), "steps_per_call must be an "
                    "int in [1, 2**31), got 4294967296"),
                   (dict(slots=0), "slots must be an int in [1, 2**31)"),
                   (dict(request_timeout=float("nan")), "request_timeout "
                    "must be > 0, got nan"),
                   (dict(request_timeout=float("inf")), "request_timeout")]:
    with pytest.raises(ValueError, match=re.escape(why)):
      Settings("m", "flash-dllm", **bad)
