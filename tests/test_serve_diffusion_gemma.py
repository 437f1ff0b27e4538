"""`serve` with a DiffusionGemma checkpoint (the tiny official one with a
tokenizer, tests/diffusion_gemma_case.py) and no --strategy (the family's
own, as generate picks it): a real server process on localhost and the
official `openai` client. Answers, their logprobs and
their streamed chunks (one per finished canvas or more canvases) equal
offline generate with the request's seed; requests with different
temperatures and canvas options share the slots and each equals offline
generate with its values; a shape-changing `decoding` option picks a
variant declared at start; what the family cannot do is refused with one
clear error."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from flash_dllm_jax import checkpoint
from flash_dllm_jax.generate import answer_ids, generate
from flash_dllm_jax.sampling.row_sampling import Sampling
from tests.diffusion_gemma_case import (FLAGS, PROMPTS, SEEDS, SETTINGS,
                                        tiny_dir)
from tests.serve_case import Server

VARIANT = dict(canvas_length=3)  # shape-changing: a --variant


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return tiny_dir(tmp_path_factory.mktemp("gemma"))


@pytest.fixture(scope="module")
def model(ckpt):
  return checkpoint.load(ckpt, dtype="float32")


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
  tmp = tmp_path_factory.mktemp("serve")
  srv = Server(ckpt, None, {}, *FLAGS, "--dtype", "float32",
               "--batch-size", "2", "--max-prompt-tokens", "64",
               "--steps-per-call", "2", "--served-model-name", "m",
               "--variant", ",".join(f"{k}={v}" for k, v in VARIANT.items()),
               "--compile-cache", str(tmp / "cache"),
               log_path=tmp / "server.log")
  try:
    health = srv.wait_ready()
    # no --strategy: serve picks the family's own, as generate does
    assert health["strategy"] == "diffusion-gemma" and health["batching"] \
        == "continuous"
    yield srv
  finally:
    srv.close()


def offline(model, prompt, seed, **changes):
  """(answer ids, their logprobs) of the prompt decoded alone."""
  out = generate(model, [prompt], seed=seed, logprobs=True,
                 **{**SETTINGS, **changes})
  ids = answer_ids(out.tokens_BxG[0], model[1])
  return ids, out.logprobs_BxG[0][:len(ids)].tolist()


def test_answers_and_logprobs_equal_offline_generate(server, model):
  """Three token-id prompts of different lengths at once (2 slots: one
  waits for a slot) and a text chat: each answer's tokens, text and
  logprobs are those of offline generate with its seed."""
  client = server.client()

  def complete(i):
    return client.completions.create(model="m", prompt=PROMPTS[i],
                                     seed=SEEDS[i], logprobs=0)

  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    answers = list(pool.map(complete, range(3)))
  tok = model[2]
  for i, r in enumerate(answers):
    assert r.model_extra["decoding"]["strategy"] == "diffusion-gemma"
    ids, lps = offline(model, PROMPTS[i], SEEDS[i])
    choice = r.choices[0]
    assert choice.model_extra["token_ids"] == ids
    assert choice.text == tok.decode(ids)
    assert choice.logprobs.token_logprobs == lps
  chat = [{"role": "user", "content": "Hi"}]
  r = client.chat.completions.create(model="m", messages=chat, seed=5)
  ids, _ = offline(model, chat, 5)
  assert r.choices[0].message.content == tok.decode(ids)


def test_streaming_sends_whole_canvases(server, model):
  """Each streamed chunk holds whole canvases (2 tokens each) but the
  last; together they are the offline answer."""
  chunks = []
  for event in server.client().completions.create(
      model="m", prompt=PROMPTS[2], seed=SEEDS[2], stream=True):
    if event.choices and event.choices[0].model_extra.get("token_ids"):
      chunks.append(event.choices[0].model_extra["token_ids"])
  ids, _ = offline(model, PROMPTS[2], SEEDS[2])
  assert sum(chunks, []) == ids and len(ids) == 6  # three canvases
  assert len(chunks) > 1
  assert all(len(c) % SETTINGS["canvas_length"] == 0 for c in chunks[:-1])


def test_decoding_options_pick_the_declared_variant(server, model):
  r = server.client().completions.create(
      model="m", prompt=PROMPTS[1], seed=SEEDS[1],
      extra_body={"decoding": VARIANT})
  assert r.model_extra["decoding"]["variant"] == 1
  ids, _ = offline(model, PROMPTS[1], SEEDS[1], **VARIANT)
  assert r.choices[0].model_extra["token_ids"] == ids


def test_per_request_values_share_the_slots(server, model):
  """Three requests at once in 2 slots, each with its own values and no
  --variant for them: an OpenAI temperature (the annealing's
  max_temperature, min_temperature capped at it), decoding options, and a
  max_tokens that ends the decode (max_out_length); each answer equals
  offline generate with those values as its row's (the program the other
  tests compiled; tests/test_diffusion_gemma_row_options.py: row values
  decode as the sampler's options)."""
  client = server.client()
  asks = [
      (0, dict(temperature=0.5), dict(max_temperature=0.5)),
      (1, dict(temperature=0.0001),
       dict(max_temperature=0.0001, min_temperature=0.0001)),
      (2, dict(max_tokens=3, extra_body={"decoding": {
          "exponent": 2.0, "entropy_bound": 0.5, "early_stop": "none",
          "stop_tokens": [20, 21]}}),
       dict(max_out_length=3, exponent=2.0, entropy_bound=0.5,
            early_stop="none", stop_tokens=(20, 21))),
  ]

  def complete(ask):
    i, kwargs, _ = ask
    return client.completions.create(model="m", prompt=PROMPTS[i],
                                     seed=SEEDS[i], logprobs=0, **kwargs)

  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    answers = list(pool.map(complete, asks))
  for (i, _, values), r in zip(asks, answers):
    assert r.model_extra["decoding"]["variant"] == 0
    ids, lps = offline(model, PROMPTS[i], SEEDS[i],
                       sampling=Sampling(**values))
    m = values.get("max_out_length")  # pad after a row's max_out_length
    ids, lps = ids[:m], lps[:m]
    assert r.choices[0].model_extra["token_ids"] == ids, (i, values)
    assert r.choices[0].logprobs.token_logprobs == lps
  # the values change the answer: not the default options' one
  assert answers[0].choices[0].model_extra["token_ids"] != \
      offline(model, PROMPTS[0], SEEDS[0])[0]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(prompt="Hi", extra_body={"decoding": {"min_temperature": 0.0}}),
     r"decoding.min_temperature: min_temperature must be >= 1e-12"),
    (dict(prompt="Hi", temperature=0.3,
          extra_body={"decoding": {"min_temperature": 0.4}}),
     r"temperature: max_temperature \(0.3\) must be >= min_temperature"),
    (dict(prompt="Hi", temperature=0.3,
          extra_body={"decoding": {"max_temperature": 0.4}}),
     "temperature sets max_temperature"),
    (dict(prompt="Hi", top_p=0.9),
     "top_p 0.9: the diffusion_gemma family's sampler has no top_p"),
    (dict(prompt="Hi", extra_body={"top_k": 5}),
     "top_k 5: the diffusion_gemma family's sampler has no top_k"),
    (dict(prompt="Hi", extra_body={"decoding": {"max_out_length": 7}}),
     "decoding.max_out_length: max_out_length 7 exceeds the sampler's "
     "max_out_length 6"),
    (dict(prompt="Hi", extra_body={"decoding": {"early_stop": "sometimes"}}),
     "decoding.early_stop: early_stop must be one of"),
    (dict(prompt="Hi", extra_body={"decoding": {"stop_tokens": "20"}}),
     "decoding.stop_tokens must be a list"),
    (dict(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                            "AAAA"}}]}]),
     "text only"),
    (dict(prompt="Hi", echo=True, logprobs=0),
     "an echoed prompt's logprobs is not supported for the diffusion_gemma "
     "family"),
    (dict(prompt="Hi", extra_body={"decoding": {"canvas_length": 4}}),
     "no variant declared at start decodes with canvas_length=4"),
    (dict(prompt="Hi", extra_body={"decoding": {"nope": 1}}),
     "unknown decoding option 'nope'"),
])
def test_what_the_family_cannot_do_gets_one_clear_error(server, kwargs,
                                                        needle):
  client = server.client()
  create = (client.chat.completions.create if "messages" in kwargs
            else client.completions.create)
  with pytest.raises(openai.BadRequestError, match=needle):
    create(model="m", **kwargs)
