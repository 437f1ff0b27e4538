"""--max-logprobs (Settings.max_logprobs): a strategy that records each
token's alternatives compiles that program with its model runner, at start,
so the first request asking for them compiles nothing on the engine thread
(no pause for the others); a request asking for more gets a 400 naming the
flag. A real Service on the tiny checkpoint, requests through its own
prepare / engine core (what the routes call)."""

from __future__ import annotations

import queue

import pytest

from flash_dllm_jax.checkpoint import load
from flash_dllm_jax.compilation import compile_clock
from flash_dllm_jax.serve.errors import BadRequest
from flash_dllm_jax.serve.protocol import ChatRequest
from flash_dllm_jax.serve.service import Service, Settings
from flash_dllm_jax.strategies import build_sampler
from tests.paths import TINY_CHECKPOINT
from tests.serve_case import TINY_OPTIONS

pytestmark = pytest.mark.slow  # one engine compilation per module
MODEL, TOP = "tiny", 3


@pytest.fixture(scope="module")
def service():
  params, config, tok = load(TINY_CHECKPOINT)
  sampler = build_sampler("flash-cache", config.arch, TINY_OPTIONS)
  service = Service(params, config, tok, sampler,
                    Settings(MODEL, "flash-cache", slots=2,
                             max_prompt_tokens=64, max_logprobs=TOP))
  yield service
  service.engine_core.stop()


def chat(top: int) -> ChatRequest:
  return ChatRequest.model_validate({
      "model": MODEL, "messages": [{"role": "user", "content": "2 + 3 ="}],
      "logprobs": True, "top_logprobs": top, "max_tokens": 8})


def test_the_first_request_for_alternatives_compiles_nothing(service):
  events = queue.Queue()
  requests = service.prepare(chat(TOP), lambda i, ev: events.put(ev))
  with compile_clock() as compiled:
    service.engine_core.add_request(requests)
    while not (ev := events.get(timeout=300)).done:
      pass
  assert ev.reason in ("stop", "length"), ev
  assert compiled[0] == 0  # the engine thread compiled nothing
  assert ev.top_logprobs and len(ev.top_logprobs) == len(ev.token_ids)
  for alternatives, own in zip(ev.top_logprobs, ev.logprobs):
    values = [lp for _, lp in alternatives]
    assert len(values) == TOP and values == sorted(values, reverse=True)
    assert own <= values[0] + 1e-5


def test_more_alternatives_than_max_logprobs_is_a_400(service):
  with pytest.raises(BadRequest, match="at most 3 \\(--max-logprobs\\)") as e:
    service.prepare(chat(TOP + 1), lambda i, ev: None)
  assert e.value.status == 400 and e.value.param == "top_logprobs"


@pytest.mark.parametrize("bad", [-1, 21, 2.0, True])
def test_settings_refuse_a_max_logprobs_out_of_range(bad):
  with pytest.raises(ValueError, match="--max-logprobs"):
    Settings(MODEL, "flash-cache", max_logprobs=bad)
