"""The supervised engine, on a real server on localhost (the app under
uvicorn in this process, so a fault can be put into the device call) with
the official client: a failed device call answers every request it held
with a 500 engine_error and the engine restarts; a stuck call still lets
deadlines answer 504; repeated failures stop the server (on_fatal) with
/health saying so and new requests refused."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from flash_dllm_jax.checkpoint import load
from flash_dllm_jax.serve import engine_core as sched
from flash_dllm_jax.serve.app import build_app
from flash_dllm_jax.serve.service import Service, Settings
from flash_dllm_jax.strategies import build_sampler
from tests.paths import TINY_CHECKPOINT
from tests.serve_case import TINY_OPTIONS, free_port

pytestmark = pytest.mark.slow  # one engine compilation per module
MODEL = "tiny"


class Fault:
  """Wraps an engine's compiled call: raises while `failing`, blocks while
  `stuck` is clear."""

  def __init__(self, engine):
    self.real, self.failing, self.calls = engine._compiled, 0, 0
    self.stuck = threading.Event()
    self.stuck.set()
    engine._compiled = self

  def __call__(self, *args):
    self.calls += 1
    self.stuck.wait()
    if self.failing:
      self.failing -= 1
      raise RuntimeError("injected device fault")
    return self.real(*args)


@pytest.fixture(scope="module")
def served():
  params, config, tok = load(TINY_CHECKPOINT)
  sampler = build_sampler("flash-dllm", config.arch, TINY_OPTIONS)
  lost = threading.Event()
  service = Service(params, config, tok, sampler,
                    Settings(MODEL, "flash-dllm", slots=2,
                             max_prompt_tokens=64, steps_per_call=1,
                             max_logprobs=0),
                    on_fatal=lost.set)
  port = free_port()
  server = uvicorn.Server(uvicorn.Config(build_app(lambda: service, MODEL),
                                         port=port, log_level="warning"))
  thread = threading.Thread(target=server.run, daemon=True)
  thread.start()
  url = f"http://127.0.0.1:{port}"
  while not server.started:
    time.sleep(0.05)
  fault = Fault(service.engine_core.runners[0])
  yield service, url, fault, lost
  server.should_exit = True
  thread.join(30)
  service.engine_core.stop()


def settled(service):
  """Waits until the engine holds nothing (a release-only call left over
  from an earlier test would otherwise take an armed fault)."""
  deadline = time.monotonic() + 60
  while not service.engine_core._idle():
    assert time.monotonic() < deadline, "the engine never went idle"
    time.sleep(0.01)


def client(url):
  return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0,
                       timeout=120)


def ask(url, i, **kw):
  """(status, error code or None) of one completion."""
  try:
    client(url).completions.create(model=MODEL, prompt=[5 + i, 6, 7],
                                   max_tokens=8, seed=i, **kw)
    return 200, None
  except openai.APIStatusError as e:
    return e.status_code, e.body.get("code") if isinstance(e.body, dict) \
        else None


def burst(url, n, **kw):
  with concurrent.futures.ThreadPoolExecutor(n) as pool:
    return list(pool.map(lambda i: ask(url, i, **kw), range(n)))


def test_a_failed_device_call_answers_500_and_the_engine_restarts(served):
  service, url, fault, _ = served
  assert burst(url, 2) == [(200, None)] * 2  # compiled and working
  settled(service)
  fault.failing = 1
  answers = burst(url, 5)  # 2 slots: some in the failed call, some queued
  assert (500, "engine_error") in answers, answers
  assert set(answers) <= {(200, None), (500, "engine_error")}, answers
  assert len(service.engine_core.restarts) == 1
  assert httpx.get(url + "/health").json()["status"] == "ready"
  assert burst(url, 3) == [(200, None)] * 3  # served again


def test_health_says_restarting_while_the_engine_is_rebuilt(served,
                                                            monkeypatch):
  service, url, fault, _ = served
  engine, gate = service.engine_core.runners[0], threading.Event()
  real_reset = engine.reset
  monkeypatch.setattr(engine, "reset", lambda: (gate.wait(60),
                                                real_reset())[1])
  settled(service)
  fault.failing = 1
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    answer = pool.submit(ask, url, 0)
    while service.engine_core.state != "restarting":
      time.sleep(0.01)
    health = httpx.get(url + "/health")
    assert health.status_code == 503
    assert health.json()["status"] == "restarting"
    gate.set()
    assert answer.result() == (500, "engine_error")
  assert httpx.get(url + "/health").json()["status"] == "ready"


def test_a_stuck_device_call_still_answers_504_at_the_deadline(served):
  service, url, fault, _ = served
  fault.stuck.clear()
  try:
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      started = fault.calls
      answer = pool.submit(ask, url, 0, extra_body={"timeout": 1.0})
      assert answer.result(timeout=60) == (504, "timeout")
    assert fault.calls > started  # it did reach the (stuck) device call
    assert time.monotonic() - t0 < 1.0 + 10
  finally:
    fault.stuck.set()
  assert burst(url, 2) == [(200, None)] * 2


def test_repeated_failures_stop_the_server(served):
  """Last: leaves the engine failed."""
  service, url, fault, lost = served
  service.engine_core.restarts.clear()
  settled(service)
  fault.failing = 10**6
  answers = []
  while service.engine_core.state != "failed":
    answers.append(ask(url, len(answers)))
    assert len(answers) <= sched.MAX_RESTARTS + 1
  assert set(answers) == {(500, "engine_error")}, answers
  assert lost.wait(10)  # the CLI stops the server here (exit status 1)
  health = httpx.get(url + "/health")
  assert health.status_code == 503 and health.json()["status"] == "failed"
  assert ask(url, 0) == (503, "engine_error")
  # a response_format request, decoded outside the slot pool, too
  assert ask(url, 0, extra_body={"response_format": {
      "type": "json_object"}}) == (503, "engine_error")
