"""The scheduler's decisions (serve/scheduler.py) on their own: no thread,
no device; the device output is written by hand."""

import numpy as np

from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.serve.model_runner import ModelRunnerOutput
from flash_dllm_jax.serve.events import Request
from flash_dllm_jax.generate import answer_ids
from flash_dllm_jax.serve.scheduler import (apply, call_steps, placed,
                                            schedule, update_from_output)
from flash_dllm_jax.serve.text import AnswerText
from flash_dllm_jax.tokenizer import Tokenizer
from tests.paths import TINY_CHECKPOINT

CONFIG = ModelConfig.tiny("llada")
MASK, EOS = CONFIG.mask_token_id, CONFIG.stop_token_ids[0]


def _request(name, deadline=None, max_tokens=4):
  return Request(ids=[1, 2, 3], key=0, seed=0, emit=None, deadline=deadline,
                 answer=AnswerText(None, CONFIG, max_tokens), decoding={
                     "name": name})


def _out(tokens, done, steps, logprobs=None, b=None, taken=None):
  """A ModelRunnerOutput of a call whose jobs are its queue (b slots, every
  slot free at its start: job b + q is queue entry q)."""
  n = len(tokens)
  b = n if b is None else b
  pad = lambda a, fill: np.concatenate([np.full((b,) + a.shape[1:], fill,
                                                a.dtype), a])
  lp = None if logprobs is None else pad(logprobs, 0.0)
  job_B = np.where(~np.asarray(done), b + np.arange(n), -1)
  return ModelRunnerOutput(pad(tokens, MASK), pad(np.asarray(done), False),
                           pad(np.asarray(steps), 0), pad(np.asarray(steps), 0),
                           3, lp, job_B=job_B, taken=n if taken is None
                           else taken, at_Q=np.zeros(n, np.int32))


def test_schedule_fails_stale_requests_and_queues_the_waiting():
  a, b, c, d = (_request(x) for x in "abcd")
  late, gone, done, e = (_request("late", deadline=5.0), _request("gone"),
                         _request("done"), _request("e"))
  gone.cancelled = True
  done.finished = True  # answered (a stop string) while its row ran on
  plan = schedule([gone, a, b, c, d], {0: late, 2: done, 3: e}, 3,
                  now=10.0)
  assert [(r.decoding["name"], why) for r, why in plan.failed] == [
      ("gone", "cancelled"), ("late", "deadline")]
  assert plan.release == (0, 2) and plan.running == {3: e}
  assert plan.queued == (a, b, c) and plan.waiting == (d,)
  # the device took two of the three: the third waits again, first
  out = _out(np.full((3, 4), MASK, np.int32), [False] * 3, [0] * 3, b=4,
             taken=2)
  out = out._replace(job_B=np.array([4, 5, -1, 3]))
  where = placed(plan, out)
  assert where.running == {0: a, 1: b, 3: e}
  assert [r for r, _ in where.loaded] == [a, b] and where.requeue == (c,)


def test_calls_are_short_while_slots_are_free_or_a_row_has_sent_nothing():
  """A burst that fills the slots runs short calls until every row has
  streamed its first tokens; requests queued behind full slots, or no
  short limit, give whole calls."""
  a, b, c = (_request(x) for x in "abc")
  full = schedule([], {0: a, 1: b}, 4, now=0.0)
  assert call_steps(full, 2, 8, 2) == 2  # neither row has sent anything
  # saturation: a request queued on the device behind full slots
  assert call_steps(schedule([c], {0: a, 1: b}, 4, now=0.0), 2, 8, 2) == 8
  a.first_token_at = 1.0
  assert call_steps(full, 2, 8, 2) == 2  # b has not
  b.first_token_at = 1.0
  assert call_steps(full, 2, 8, 2) == 8  # every row streams
  assert call_steps(schedule([], {0: a}, 4, now=0.0), 2, 8, 2) == 2  # free
  assert call_steps(schedule([c], {0: a}, 4, now=0.0), 2, 8, 3) == 3
  assert call_steps(schedule([c], {0: a, 1: b}, 0, now=0.0), 2, 8, 2) == 8
  assert call_steps(schedule([], {0: a}, 4, now=0.0), 2, 8, None) == 8
  assert call_steps(schedule([], {0: a}, 4, now=0.0), 2, 1, 2) == 1


def test_update_streams_final_prefixes_and_finishes_answers():
  r0, r1, r2 = _request("r0"), _request("r1"), _request("r2", max_tokens=2)
  plan = schedule([r0, r1, r2], {}, 3, now=0.0)
  tokens = np.array([[5, MASK, 7, 8],      # r0: one final token so far
                     [5, 6, EOS, MASK],    # r1: complete (stop), loop on
                     [9, 9, MASK, MASK]],  # r2: max_tokens reached
                    np.int32)
  out = _out(tokens, [False] * 3, [1, 2, 3], np.full((3, 4), -0.5,
                                                     np.float32))
  before = {r: r.answer for r in (r0, r1, r2)}
  step = update_from_output(plan, out, now=1.0)
  # pure: the requests are as they were until the caller applies the update
  assert all(r.answer is before[r] and r.first_token_at is None
             for r in (r0, r1, r2))
  assert before[r0].ids_sent == 0 and before[r0].sent == ""
  by = {r.decoding["name"]: ev for r, ev in step.events}
  assert by["r0"].new_ids == (5,) and not by["r0"].done
  assert by["r0"].new_logprobs == (-0.5,)
  assert by["r1"].done and by["r1"].reason == "stop" and \
      by["r1"].token_ids == [5, 6] and by["r1"].logprobs == [-0.5, -0.5]
  assert by["r2"].done and by["r2"].reason == "length" and \
      by["r2"].usage["completion_tokens"] == 2
  assert step.finished == (r1, r2)
  apply(step)
  assert all(r.first_token_at == 1.0 for r in (r0, r1, r2))
  assert r0.answer.ids_sent == 1 and r0.answer is not before[r0]
  # r1 and r2 finished while their rows ran on: the next call stops them
  for r in step.finished:
    r.finished = True
  where = placed(plan, out)
  assert where.running == {0: r0, 1: r1, 2: r2}
  assert schedule([], where.running, 3, now=2.0).release == (1, 2)


def test_a_stop_string_cuts_text_ids_and_logprobs_alike_streamed_or_not():
  """vLLM's cut: the text ends before the stop string, the ids with the
  token that completed it; streamed ids never run past the text sent."""
  tok = Tokenizer.from_dir(TINY_CHECKPOINT)
  ids = tok.encode("the answer is Liam and then some more words follow")
  cut = next(k for k in range(len(ids) + 1) if "Liam" in tok.decode(ids[:k]))
  gen = np.array(ids + [EOS] * 4, np.int32)
  whole, _ = AnswerText(tok, CONFIG, 64, ["Liam"]).update(gen, True)
  assert whole.done and whole.reason == "stop"
  assert whole.delta == tok.decode(ids).split("Liam")[0]
  assert whole.token_ids == ids[:cut] and cut < len(ids)
  # the same answer committed left to right, a token per update
  answer, sent, text = AnswerText(tok, CONFIG, 64, ["Liam"]), [], ""
  for k in range(len(gen) + 1):
    partial = np.where(np.arange(len(gen)) < k, gen, MASK).astype(np.int32)
    p, answer = answer.update(partial, k == len(gen))
    sent += p.new_ids
    text += p.delta
    if p.done:
      break
    assert text.startswith(tok.decode(sent))  # ids never run ahead
  assert p.done and sent == ids[:cut] and text == whole.delta
  # through update_from_output: usage and logprobs end where the ids do
  r = Request(ids=[1, 2], key=0, seed=0, emit=None,
              answer=AnswerText(tok, CONFIG, 64, ["Liam"]))
  plan = schedule([r], {}, 1, now=0.0)
  lp = -np.arange(1, len(gen) + 1, dtype=np.float32)[None] / 10
  out = _out(gen[None], [True], [3], lp)
  (_, ev), = update_from_output(plan, out, now=1.0).events
  assert ev.usage["completion_tokens"] == cut == len(ev.token_ids)
  assert ev.logprobs == [float(x) for x in lp[0, :cut]]


def test_an_editing_sampler_streams_only_the_blocks_it_cannot_edit():
  """LLaDA2.1's T2T edits change committed tokens of the current block (and,
  in post-edit steps, of a block with no mask left): streamed text comes
  only from the blocks before it, so it is never revised."""
  tok = Tokenizer.from_dir(TINY_CHECKPOINT)
  a, b = tok.encode("one two three four five"), tok.encode("six seven")
  n, bl = 3, 4  # the prompt's length places the blocks: 1 + 4 + 4 + ...
  final = np.array((a + b + [EOS] * 12)[:12], np.int32)
  edited = final.copy()
  edited[1:5] = final[5]  # block 1 (gen 1..4) as first committed
  steps = [np.where(np.arange(12) < k, edited if k <= 5 else final, MASK)
           for k in (1, 3, 5)]  # block 1 filling, then full and edited
  steps += [np.where(np.arange(12) < 5, final, MASK),  # post-edit: fixed
            np.where(np.arange(12) < 7, final, MASK), final]
  answer, text = AnswerText(tok, CONFIG, 64, (), bl, n), ""
  settled = []
  for k, gen in enumerate(steps):
    p, answer = answer.update(gen.astype(np.int32), k == len(steps) - 1)
    text += p.delta
    settled.append(len(tok.decode(answer_ids(final, CONFIG))) if p.done
                   else len(text))
  one = len(tok.decode(final[:1].tolist()))  # block 0: gen 0 alone
  assert settled[:5] == [0, 0, one, one, one]
  assert not answer.revised
  assert text == tok.decode(answer_ids(final, CONFIG))
  # without edit_block the same stream sends block 1's first version
  naive = AnswerText(tok, CONFIG, 64)
  for k, gen in enumerate(steps):
    _, naive = naive.update(gen.astype(np.int32), k == len(steps) - 1)
  assert naive.revised


def test_an_update_whose_final_tokens_did_not_change_equals_a_full_one():
  """A row whose final prefix did not grow is answered from the state
  (nothing to send) without decoding again: the same progress and state as
  an update that decodes, with and without a stop string, through
  out-of-order commits and stop tokens."""
  tok = Tokenizer.from_dir(TINY_CHECKPOINT)
  ids = tok.encode("the answer is Liam and then some more words follow")
  rng = np.random.default_rng(0)
  for stop in ((), ("Liam",), ("more w",)):
    for trial in range(4):
      gen = np.array(ids + [EOS] * 3, np.int32)
      order = rng.permutation(len(gen))  # commit order: not left to right
      fast = slow = AnswerText(tok, CONFIG, 64 if trial else 9, stop)
      for k in range(len(gen) + 1):
        partial = np.where(np.isin(np.arange(len(gen)), order[:k]), gen,
                           MASK).astype(np.int32)
        done = k == len(gen)
        p, fast = fast.update(partial, done)
        q, slow = slow._with(settled=-1).update(partial, done)
        assert p == q
        assert (fast.sent, fast.ids_sent, fast.revised) == \
            (slow.sent, slow.ids_sent, slow.revised)
        if p.done:
          break


def test_answer_ids_end_before_the_first_stop_token():
  rng = np.random.default_rng(0)
  stops = set(CONFIG.stop_token_ids)
  for _ in range(200):
    gen = rng.choice([*stops, 5, 6, MASK], size=rng.integers(0, 20)).astype(
        np.int32)
    want = []
    for t in gen.tolist():
      if t in stops:
        break
      want.append(t)
    got = answer_ids(gen, CONFIG)
    assert got == want and all(type(t) is int for t in got)
