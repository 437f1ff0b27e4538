"""The slot engine without HTTP: requests of every prompt length sharing
one slot pool, arriving while others decode, more new requests in one call
than Flash-dLLM's max_refills (prefilled together), llada2-flash rows with
their own rule options, each answer equal to offline generate."""

import os
import subprocess
import sys

import numpy as np
import pytest

from flash_dllm_jax import generate, load
from flash_dllm_jax.generate import answer_ids
from flash_dllm_jax.serve.model_runner import ModelRunner
from flash_dllm_jax.strategies import build_sampler
from tests.paths import ROOT, TINY_CHECKPOINT


def _serve_all(engine, requests, config, per_call=None):
  """Drives the engine until every request is answered, handing each call
  the waiting requests (at most per_call of them) as its queue, which it
  loads into slots as rows finish. Returns ({index: answer tokens, masks
  after the stop as pad}, device calls, most loaded by one call, requests
  loaded inside the loop, after a step)."""
  waiting, held, got = list(range(len(requests))), {}, {}
  calls = most = inside = 0
  while len(got) < len(requests):
    queue = waiting[:per_call or engine.q]
    out = engine.cycle(queue=[requests[i] for i in queue])
    calls, most = calls + 1, max(most, out.taken)
    inside += int(np.sum(out.at_Q[:out.taken] > 0))
    jobs = {**held, **{engine.b + q: i
                       for q, i in enumerate(queue[:out.taken])}}
    waiting = queue[out.taken:] + waiting[len(queue):]
    for j, i in jobs.items():
      if out.done_J[j]:
        got[i] = np.where(out.tokens_JxG[j] == config.mask_token_id,
                          config.pad_token_id, out.tokens_JxG[j])
    held = {s: jobs[int(j)] for s, j in enumerate(out.job_B) if j >= 0}
  return got, calls, most, inside


FLASH = {"gen_length": 16, "block_m": 8, "max_refills": 2}


def _prompts():
  """20 prompts of 1 to 128 tokens (both prompt buckets)."""
  rng = np.random.default_rng(0)
  return [[int(t) for t in rng.integers(0, 370, int(n))]
          for n in rng.integers(1, 129, 20)]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,options", [
    ("flash-dllm", FLASH),
    ("elastic-cache", {"gen_length": 16})])
def test_online_admission_equals_offline(strategy, options):
  params, config, tok = load(TINY_CHECKPOINT)
  sampler = build_sampler(strategy, config.arch, options)
  engine = ModelRunner(params, config, sampler, prompt_len=128, slots=6,
                      steps_per_call=3)
  assert engine.continuous
  prompts = _prompts()
  # Offline pads them to 64 or 128: the pool adds 64 to some.
  assert {-(-len(p) // 64) for p in prompts} == {1, 2}
  seeds = list(range(20))
  # requests arrive over time: three per call, more than Flash-dLLM's
  # max_refills at once
  got, calls, most, inside = _serve_all(
      engine, [(p, s) for p, s in zip(prompts, seeds)], config, per_call=3)
  ref = generate((params, config, tok), prompts, sampler=sampler, seed=seeds)
  for i in range(20):
    assert answer_ids(got[i], config) == answer_ids(ref.tokens_BxG[i], config)
  assert calls < 20 * sampler.num_steps  # several steps per host round trip
  assert most == 3  # one call took more new requests than max_refills
  assert inside > 0  # slots refilled inside the compiled loop


@pytest.mark.slow
def test_llada2_flash_rows_with_their_own_options_equal_offline():
  """llada2-flash through two slots with refills: rows with their own
  threshold / gamma, greedy or with their own temperature / top_k (row data
  in the one compiled loop), each equal offline generate with the same
  settings."""
  import jax
  from flash_dllm_jax.config import ModelConfig
  from flash_dllm_jax.model import init_params
  from flash_dllm_jax.sampling.row_sampling import GREEDY, Sampling
  config = ModelConfig.tiny("llada2")
  params = init_params(config, jax.random.key(7), head_init_scale=8.0)
  sampler = build_sampler("llada2-flash", "llada2", {
      "gen_length": 16, "block_length": 4, "threshold": 0.7, "gamma": 0.5})
  engine = ModelRunner(params, config, sampler, prompt_len=128, slots=2,
                      steps_per_call=3)
  assert engine.continuous
  rng = np.random.default_rng(1)
  prompts = [[int(t) for t in rng.integers(0, 300, int(n))]
             for n in (5, 12, 9, 17)]
  settings = [Sampling(gamma=0.05), GREEDY, Sampling(threshold=0.3),
              Sampling(temperature=0.8, top_k=5, threshold=0.3,
                       gamma=0.05)]
  got, _, _, _ = _serve_all(engine, [(p, 0, r) for p, r in zip(prompts,
                                                              settings)],
                         config)
  ref = generate((params, config, None), prompts, sampler=sampler,
                 sampling=settings)
  for i in range(4):
    assert answer_ids(got[i], config) == answer_ids(ref.tokens_BxG[i],
                                                    config), i
  plain = generate((params, config, None), prompts, sampler=sampler)
  assert (plain.steps_B != ref.steps_B).any()  # the row options mattered


@pytest.mark.slow
def test_the_engine_core_answers_a_call_while_the_next_one_runs(monkeypatch):
  """The engine thread collects a call, dispatches the next, and only then
  turns the collected output into events (update_from_output), so
  detokenizing and sending overlap the device's work; every request is
  answered once, as offline generate answers it, with max_tokens cuts and a
  stop string (whose slot is released a call later). A call runs
  steps_while_admitting steps while a slot is free and none waits beyond
  its queue, else steps_per_call. The engine and the prompts of
  test_online_admission_equals_offline[flash-dllm]: its compiled
  programs."""
  import threading
  from flash_dllm_jax.serve import scheduler
  from flash_dllm_jax.serve.events import Request
  from flash_dllm_jax.serve.metrics import Metrics
  from flash_dllm_jax.serve.engine_core import EngineCore
  from flash_dllm_jax.serve.text import AnswerText
  params, config, tok = load(TINY_CHECKPOINT)
  sampler = build_sampler("flash-dllm", config.arch, FLASH)
  engine = ModelRunner(params, config, sampler, prompt_len=128, slots=6,
                      steps_per_call=3)
  order, limits = [], []
  for name in ("dispatch", "collect"):
    real = getattr(engine, name)
    monkeypatch.setattr(engine, name, lambda *a, real=real, name=name, **k: (
        order.append(name), limits.append(k.get("steps", "collect")),
        real(*a, **k))[2])
  real_update = scheduler.update_from_output
  monkeypatch.setattr(scheduler, "update_from_output", lambda *a: (
      order.append("update"), real_update(*a))[1])
  prompts = _prompts()
  n = len(prompts)
  ref = generate((params, config, tok), prompts, sampler=sampler,
                 seed=list(range(n)))
  want = [answer_ids(g, config) for g in ref.tokens_BxG]
  assert len(want[2]) >= 4
  stop = tok.decode(want[2][2:4])  # cuts request 2's text mid-answer
  texts, answers, all_done = [""] * n, {}, threading.Event()

  def emit(i, ev):
    texts[i] += ev.delta
    if ev.done:
      answers[i] = (ev.token_ids, ev.reason)
      if len(answers) == n:
        all_done.set()

  requests = [Request(ids=p, key=0, seed=i, answer=AnswerText(
      tok, config, 5 if i == 4 else 16, [stop] if i == 2 else []),
      emit=lambda ev, i=i: emit(i, ev)) for i, p in enumerate(prompts)]
  core = EngineCore({0: engine}, Metrics(), max_queue=32,
                    steps_while_admitting=1)
  core.start()
  core.add_request(requests)
  assert all_done.wait(300)
  core.stop()
  for i in set(range(n)) - {2, 4}:
    assert answers[i][0] == want[i], i
  assert answers[4] == (want[4][:5], "length")
  full = tok.decode(want[2])
  assert answers[2][1] == "stop" and texts[2] == full[:full.index(stop)]
  # collect k, dispatch k + 1, update k: never an update right after its
  # own call's collect while another call was dispatched after it.
  steady = [i for i, name in enumerate(order) if name == "update"
            and order[i - 1] == "dispatch"]
  assert len(steady) >= 2, order
  for i in steady:
    assert order[i - 2] == "collect", order
  # 20 requests on 6 slots: full-pool calls (3 steps), then the last ones
  # with a slot free (1 step)
  assert set(limits) == {1, 3, "collect"}, limits


MESH_SCRIPT = r'''
import numpy as np, jax
assert len(jax.devices()) == 2, jax.devices()
from flash_dllm_jax import generate, load, parallel
from flash_dllm_jax.generate import answer_ids
from flash_dllm_jax.serve.model_runner import ModelRunner
from flash_dllm_jax.strategies import build_sampler
from tests.paths import TINY_CHECKPOINT
params, config, tok = load(TINY_CHECKPOINT)
sampler = build_sampler("llada", config.arch,
                        {"gen_length": 16, "steps": 8, "block_length": 8})
engine = ModelRunner(params, config, sampler, prompt_len=128, slots=4,
                    steps_per_call=3, mesh=parallel.parse_mesh("data=2"))
assert not engine.continuous
assert engine._state.decode.tokens_BxN.sharding.spec[0] == "data"
rng = np.random.default_rng(0)
prompts = [[int(t) for t in rng.integers(0, 370, int(n))]
           for n in rng.integers(1, 33, 6)]
waiting, held, got = list(range(6)), {}, {}
while len(got) < 6:
  queue = waiting[:engine.q]
  out = engine.cycle(queue=[(prompts[i], i) for i in queue])
  jobs = {**held, **{engine.b + q: i for q, i in enumerate(queue)}}
  waiting = waiting[out.taken:]
  for j, i in jobs.items():
    if out.done_J[j]:
      got[i] = out.tokens_JxG[j]
  held = {s: jobs[int(j)] for s, j in enumerate(out.job_B) if j >= 0}
ref = generate((params, config, tok), prompts, sampler=sampler,
               seed=list(range(6)))
for i in range(6):
  assert answer_ids(got[i], config) == answer_ids(ref.tokens_BxG[i], config), i
print("ok")
'''


@pytest.mark.slow
def test_slots_split_over_a_data_mesh_equal_offline():
  """A batch-mode strategy's slots over `data=2` (forced host devices): the
  answers equal one-device offline generate."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
             JAX_DEFAULT_MATMUL_PRECISION="highest",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  r = subprocess.run([sys.executable, "-c", MESH_SCRIPT], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
