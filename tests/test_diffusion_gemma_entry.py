"""DiffusionGemma through the entry points: a checkpoint directory with a
tokenizer loads with it (tests/diffusion_gemma_case.py), so text prompts,
the Gemma 4 chat template and the CLI work; continuous batching gives
every request its alone answer; the generic temperature maps onto the
annealing the same way from generate, the CLI and lm-eval's model_args.
All decodes share one sampler setting (and so one compiled program per
entry point)."""

import json

import numpy as np
import pytest

from flash_dllm_jax import checkpoint, cli, strategies
from flash_dllm_jax.architectures.diffusion_gemma.config import ARCH
from flash_dllm_jax.architectures.diffusion_gemma.sampler import (
    DiffusionGemmaSampler)
from flash_dllm_jax.generate import generate
from flash_dllm_jax.sampling.row_sampling import Sampling
from tests.diffusion_gemma_case import (FLAGS, PROMPTS, SEEDS, SETTINGS,
                                        tiny_dir, tiny_tokenizer)



@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return tiny_dir(tmp_path_factory.mktemp("gemma"))


@pytest.fixture(scope="module")
def model(ckpt):
  return checkpoint.load(ckpt, dtype="float32")


def test_the_tokenizer_loads_with_the_checkpoint(model):
  """Special tokens the files do not name come from the checkpoint's ids,
  the chat template is Gemma 4's, and the canvas noise is drawn from the
  tokenizer's ids."""
  _, config, tok = model
  assert (tok.bos_id, tok.eos_id, tok.eot_id) == (2, 1, 106)
  assert config.text_vocab_size == tok.vocab_size == 160
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert text == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n"
  assert tok.encode(text)[:2] == [2, 105]
  assert tok.decode(tok.encode("Hi there, 42!")) == "Hi there, 42!"


def test_cli_generate_answers_a_text_prompt(model, ckpt, capsys):
  """`generate --checkpoint DIR --prompt TEXT` renders the chat template
  and prints the answer generate() gives for the same chat."""
  code = cli.main(["generate", "--checkpoint", str(ckpt), "--prompt", "Hi",
                   *FLAGS, "--seed", "3", "--output", "json"])
  out = capsys.readouterr()
  assert code == 0, out.err
  got = json.loads(out.out)["results"][0]
  want = generate(model, [{"role": "user", "content": "Hi"}], seed=3,
                  logprobs=True, **SETTINGS)  # the program `alone` runs
  assert got["text"] == want.texts[0]
  ids = want.tokens_BxG[0].tolist()
  assert got["token_ids"] == ids[:len(got["token_ids"])]


# SETTINGS with the generic temperature in place of max_temperature (the
# same sampler, so the same compiled program): the CLI's flags, generate's
# and lm-eval's options.
AS_TEMPERATURE = {**{k: v for k, v in SETTINGS.items()
                     if k != "max_temperature"},
                  "temperature": SETTINGS["max_temperature"]}
TEMPERATURE_FLAGS = [f for i, f in enumerate(FLAGS) if "--max-temperature"
                     not in FLAGS[max(i - 1, 0):i + 1]] + [
                         "--temperature", str(SETTINGS["max_temperature"])]


def test_cli_temperature_is_generate_with_max_temperature(model, ckpt,
                                                          capsys):
  """`generate --temperature T` (and generate(temperature=T)) decodes with
  max_temperature = T, the stated min_temperature kept."""
  assert "--max-temperature" not in TEMPERATURE_FLAGS
  code = cli.main(["generate", "--checkpoint", str(ckpt), "--prompt", "Hi",
                   *TEMPERATURE_FLAGS, "--seed", "3", "--output", "json"])
  out = capsys.readouterr()
  assert code == 0, out.err
  got = json.loads(out.out)["results"][0]
  chat = [{"role": "user", "content": "Hi"}]
  want = generate(model, chat, seed=3, **SETTINGS)
  mapped = generate(model, chat, seed=3, **AS_TEMPERATURE)
  assert mapped.tokens_BxG.tolist() == want.tokens_BxG.tolist()
  assert got["text"] == want.texts[0]
  ids = want.tokens_BxG[0].tolist()
  assert got["token_ids"] == ids[:len(got["token_ids"])]


@pytest.mark.parametrize("given, want", [
    (dict(temperature=0.3), dict(max_temperature=0.3, min_temperature=0.3)),
    (dict(temperature=0.6), dict(max_temperature=0.6, min_temperature=0.4)),
    (dict(temperature=0.6, min_temperature=0.1),
     dict(max_temperature=0.6, min_temperature=0.1)),
    (dict(temperature=0.0), dict(max_temperature=1e-12,
                                 min_temperature=1e-12)),
    (dict(temperature=0.5, top_p=1.0, top_k=-1), dict(max_temperature=0.5)),
])
def test_temperature_sets_the_annealing(given, want):
  """max_temperature = T (T = 0: the official floor 1e-12);
  min_temperature = min(the sampler's, T) unless given; top_p / top_k
  only off. The same sampler from generate's options (build_sampler) and
  the CLI's / lm-eval's (build)."""
  expected = DiffusionGemmaSampler(**{
      k: v for k, v in {**given, **want}.items()
      if k not in ("temperature", "top_p", "top_k")})
  assert strategies.build_sampler("diffusion-gemma", ARCH, given) == expected
  assert strategies.build("diffusion-gemma", ARCH, given) == (expected, None)


@pytest.mark.parametrize("given, needle", [
    (dict(top_p=0.9), r"--top-p: top_p 0.9: the diffusion_gemma family's "
     r"sampler has no top_p \(the official one has neither"),
    (dict(top_k=5), r"--top-k: top_k 5: the diffusion_gemma family's "
     "sampler has no top_k"),
    (dict(temperature=0.3, max_temperature=0.5),
     "--temperature: temperature sets max_temperature"),
    (dict(temperature=0.3, min_temperature=0.5),
     r"--temperature: .*max_temperature \(0.3\) must be >= min_temperature"),
    (dict(temperature=2.5), r"--temperature: temperature must be in \[0, 2\]"),
])
def test_what_temperature_cannot_set_gets_one_error(given, needle):
  with pytest.raises(ValueError, match=needle):
    strategies.build("diffusion-gemma", ARCH, given)


def test_cli_refuses_top_p_naming_the_family(ckpt, capsys):
  code = cli.main(["generate", "--checkpoint", str(ckpt), "--prompt", "Hi",
                   *FLAGS, "--top-p", "0.9"])
  err = capsys.readouterr().err
  assert code == 1
  assert "the diffusion_gemma family's sampler has no top_p" in err
  assert err.count("error:") == 1


def test_a_sentencepiece_only_directory_gets_one_clear_error(tmp_path):
  d = tiny_dir(tmp_path)
  (d / "tokenizer.json").unlink()
  (d / "tokenizer.model").write_bytes(b"\x00")
  with pytest.raises(ValueError, match="tokenizer.model but no "
                     "tokenizer.json"):
    checkpoint.load(d, dtype="float32")


def test_a_tokenizer_that_disagrees_with_the_checkpoint_is_refused(tmp_path):
  d = tiny_dir(tmp_path)
  tok = tiny_tokenizer()
  tok.config["bos_token"] = "<eos>"
  tok.save(d)
  with pytest.raises(ValueError, match="bos_token '<eos>' has id 1"):
    checkpoint.load(d, dtype="float32")


@pytest.fixture(scope="module")
def alone(model):
  return [generate(model, [p], seed=s, logprobs=True, **SETTINGS)
          for p, s in zip(PROMPTS, SEEDS)]


def test_continuous_batching_gives_every_request_its_alone_answer(model,
                                                                  alone):
  """Six prompts of 2 to 12 tokens through 2 slots (a finished row's slot
  takes the next prompt inside the loop): each row's tokens, steps and
  forwards are bitwise those of the prompt decoded alone; rows stop their
  canvases early at different steps and end on an end token in the second
  or third canvas or run out of canvases."""
  out = generate(model, PROMPTS, seed=SEEDS, batch_size=2, logprobs=True,
                 **SETTINGS)
  for i, one in enumerate(alone):
    assert out.tokens_BxG[i].tolist() == one.tokens_BxG[0].tolist(), i
    assert out.steps_B[i] == one.steps_B[0]
    assert out.forwards_B[i] == one.forwards_B[0]
    assert out.logprobs_BxG[i].tolist() == one.logprobs_BxG[0].tolist()
  assert out.steps < sum(int(a.steps) for a in alone)
  assert len(set(out.steps_B.tolist())) > 3, out.steps_B
  _, config, _ = model
  ends = [next((i // 2 for i, t in enumerate(row)
                if t in config.stop_token_ids), None)
          for row in out.tokens_BxG.tolist()]
  assert {1, 2, None} <= set(ends), ends


def test_lm_eval_simple_evaluate_generates_through_the_strategy(model, ckpt):
  """lm-eval's simple_evaluate on a local generate_until task: the
  adapter picks diffusion-gemma for the checkpoint, renders each context
  with Gemma 4's chat template and answers what generate answers (request
  0 with seed 0) with the request's gen_kwargs temperature T as its row's
  max_temperature (the stated min_temperature kept; no model_args
  temperature); model_args temperature T is the sampler's max_temperature
  (and wins over the requests'); loglikelihood is refused with one clear
  error."""
  lm_eval = pytest.importorskip("lm_eval")
  from flash_dllm_jax.lm_eval import FlashDLLMJax, task_manager
  from flash_dllm_jax.lm_eval.model import cut_at_until
  from flash_dllm_jax.sampling.row_sampling import Sampling
  unstated = {k: v for k, v in SETTINGS.items() if k != "max_temperature"}
  args = {"checkpoint": str(ckpt), "dtype": "float32", "batch_size": 2,
          "chat": True, **unstated}
  t = SETTINGS["max_temperature"]
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args=args, tasks=["synthetic_gsm"],
      task_manager=task_manager(include_defaults=False), limit=1,
      gen_kwargs=f"do_sample=true,temperature={t}",
      log_samples=True)  # one prompt-length bucket: one compiled program
  samples = sorted((s for s in results["samples"]["synthetic_gsm"]
                    if s["filter"] == "strict-match"),
                   key=lambda s: s["doc_id"])
  chats = [[{"role": "user", "content": s["arguments"][0][0]}]
           for s in samples]
  until = samples[0]["arguments"][0][1]["until"]
  assert samples[0]["arguments"][0][1]["temperature"] == t
  out = generate(model, chats, seed=[0], batch_size=2, **unstated,
                 sampling=[Sampling(max_temperature=t)])
  assert [s["resps"][0][0] for s in samples] == [
      cut_at_until(text, until) for text in out.texts]
  own = generate(model, chats, seed=[0], batch_size=2, **unstated,
                 sampling=[Sampling(max_temperature=0.8)])  # the same program
  assert own.tokens_BxG.tolist() != out.tokens_BxG.tolist()
  info = results["config"]["flash_dllm_jax"]
  assert info["strategy"] == "diffusion-gemma"
  assert info["throughput"]["generate_until"]["requests"] == 1
  lm = FlashDLLMJax(checkpoint=str(ckpt), dtype="float32", **AS_TEMPERATURE)
  sampler = lm.sampler_for(SETTINGS["max_out_length"])[0]
  assert sampler == DiffusionGemmaSampler(**SETTINGS)
  from flash_dllm_jax.lm_eval import gen_kwargs
  assert gen_kwargs.row(sampler, lm.options, lm.sampling, 0.5) is None
  from lm_eval.api.instance import Instance
  with pytest.raises(NotImplementedError, match="diffusion_gemma family"):
    lm.loglikelihood([Instance("loglikelihood", {}, ("a", "b"), 0)])


@pytest.mark.parametrize("given, temperature, want", [
    ({}, 0.5, Sampling(max_temperature=0.5)),  # min stays 0.4
    ({}, 0.0, Sampling(max_temperature=1e-12, min_temperature=1e-12)),
    ({}, 0.8, None),  # the sampler's own: no row values
    ({"min_temperature": 0.1}, 0.3, Sampling(max_temperature=0.3)),
    ({"max_temperature": 0.9}, 0.3, None),  # model_args state it
    ({"temperature": 0.9}, 0.3, None),
    ({}, None, None),
])
def test_a_requests_temperature_is_its_rows(given, temperature, want):
  """gen_kwargs.row: a request's temperature through the family's
  mapping, unless model_args state the temperature."""
  from flash_dllm_jax.lm_eval import gen_kwargs
  sampler, base = strategies.build("diffusion-gemma", ARCH, given)
  assert gen_kwargs.row(sampler, given, base, temperature) == want
