"""SDAR-30B-A3B (model_type sdar_moe) on the engine's MoE: a tiny directory
in the genuine format (transformers' Qwen3-MoE saved by save_pretrained,
the genuine config.json key set, the chat template in chat_template.jinja)
loads and converts (8-bit too), its forward equals transformers'
Qwen3MoeForCausalLM under SDAR's block-causal mask, and strategy `sdar`
decodes it as the plain-Python restatement of generate.py does; the
command line, continuous batching, lm-eval's simple_evaluate and the server
(official client) answer as offline generate. Expert parallelism:
tests/test_mesh_experts.py."""

import json

import numpy as np
import pytest

import flash_dllm_jax as fdj
from flash_dllm_jax import cli
from flash_dllm_jax.config import ModelConfig
from flash_dllm_jax.generate import answer_ids
from tests import sdar_fixtures
from tests.serve_case import check_answers_equal_offline
from tests.test_sdar import BL, check_generate_equals_the_reference_loop


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """(HF directory, the transformers model holding its weights, its
  config.json dict)."""
  return sdar_fixtures.write_sdar_moe(
      tmp_path_factory.mktemp("sdar-moe") / "hf", seed=1)


@pytest.fixture(scope="module")
def model(hf):
  return fdj.load(hf[0], dtype="float32")


def test_config_tokens_and_chat_come_from_the_genuine_files(model):
  params, config, tok = model
  moe = config.moe
  assert (config.arch, moe.n_experts, moe.top_k, moe.hidden) == ("sdar", 8,
                                                                  2, 16)
  assert (moe.score, moe.norm_topk, moe.n_shared, moe.expert_bias,
          moe.first_dense_layers) == ("softmax", True, 0, False, 1)
  assert config.mask_token_id == tok.token_to_id("<|MASK|>")  # tokenizer's
  assert config.stop_token_ids == (tok.token_to_id("<|endoftext|>"),
                                   tok.token_to_id("<|im_end|>"))
  assert "up_proj" in params["layers_0"] and "moe" not in params["layers_0"]
  assert params["layers_1"]["moe"]["experts_up"]["kernel"].shape == (8, 32,
                                                                     16)
  assert params["layers_1"]["moe"]["router"].shape == (32, 8)
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("block_length", [None, BL])
def test_forward_matches_transformers_qwen3moe_under_the_mask(
    model, hf, block_length):
  sdar_fixtures.check_forward(model, hf[1], block_length)


def test_converted_and_8bit_checkpoints(hf, model, tmp_path):
  params, config = sdar_fixtures.check_conversions(hf[0], model, tmp_path, BL)
  assert config.moe == model[1].moe
  stack = params["layers_1"]["moe"]["experts_gate"]
  assert stack["kernel_q"].shape == (8, 16, 32)
  assert stack["kernel_q"].dtype == np.int8


def test_generate_equals_the_reference_loop(model, hf):
  """Dynamic low-confidence remasking, the reference's canvas and model
  calls row by row (the dense family's check)."""
  check_generate_equals_the_reference_loop(
      model, hf[1], dict(remasking_strategy="low_confidence_dynamic",
                         confidence_threshold=0.6))


@pytest.mark.parametrize("changes,message", [
    (dict(decoder_sparse_step=2, mlp_only_layers=[]),
     r"decoder_sparse_step=2, mlp_only_layers=\[\] put the experts in "
     r"layers \[1, 3\], not in one run"),
    (dict(mlp_only_layers=[1]), r"in layers \[0, 2, 3\], not in one run"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step=0 \\(a positive"),
    (dict(mlp_only_layers=1), "mlp_only_layers=1 \\(a list of layer"),
    (dict(num_experts_per_tok=1),
     "norm_topk_prob=True with num_experts_per_tok=1"),
])
def test_unsupported_layouts_get_one_clear_error(hf, changes, message):
  config = {**hf[2], "num_hidden_layers": 4, "mask_token_id": 5, **changes}
  with pytest.raises(ValueError, match="unsupported SDAR config values: "
                     ".*" + message):
    ModelConfig.from_hf_config(config)


def test_expert_layout_as_the_genuine_code_builds_it(hf):
  """Layers from the first MoE one to the last: first_dense_layers; no MoE
  layer (every layer MLP-only): a dense model."""
  base = {**hf[2], "num_hidden_layers": 4, "mask_token_id": 5}
  read = lambda **c: ModelConfig.from_hf_config({**base, **c}).moe
  assert read(mlp_only_layers=[0, 1]).first_dense_layers == 2
  assert read(mlp_only_layers=[]).first_dense_layers == 0
  assert read(mlp_only_layers=[0, 1, 2, 3]) is None
  assert read(norm_topk_prob=False).norm_topk is False


# The entry points on the MoE checkpoint: one sampler setting (the reference
# test's), so the CLI's decode reuses offline generate's program.
ENTRY = dict(gen_length=16, block_length=BL, denoising_steps=BL,
             temperature=0.0, remasking_strategy="low_confidence_dynamic",
             confidence_threshold=0.6)
PROMPT = "The quick brown fox"


def offline(model, prompts, chat: bool, **kw):
  return fdj.generate(model, prompts, strategy="sdar", chat=chat, **ENTRY,
                      **kw)


def test_command_line_answers_as_generate(hf, model, capsys):
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENTRY.items()]
  code = cli.main(["generate", "--checkpoint", str(hf[0]), "--dtype",
                   "float32", *flags, "--no-chat", "--prompt", PROMPT,
                   "--output", "json"])
  out = capsys.readouterr()
  assert code == 0, out.err  # strategy: the family's default, sdar
  [result] = json.loads(out.out)["results"]
  want = offline(model, [PROMPT], chat=False)
  assert result["token_ids"] == answer_ids(want.tokens_BxG[0], model[1])


def test_continuous_batching_equals_each_request_alone(model):
  """Four prompts through two slots in one compiled loop: every answer,
  model call count and step count equals that request alone, and the
  refilled slots take fewer loop steps than the requests one by one."""
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 290, n).tolist() for n in (5, 11, 8, 14)]
  queued = offline(model, prompts, chat=False, batch_size=2)
  total = 0
  for i, p in enumerate(prompts):
    alone = offline(model, [p], chat=False)
    assert queued.tokens_BxG[i].tolist() == alone.tokens_BxG[0].tolist(), i
    assert queued.forwards_B[i] == alone.forwards_B[0]
    assert queued.steps_B[i] == alone.steps_B[0] == alone.steps
    total += int(alone.steps)
  assert total / 2 <= queued.steps < total


def test_lm_eval_simple_evaluate_generates_as_generate(hf, model):
  """lm-eval's simple_evaluate on a local generate_until task: the adapter
  picks sdar for the checkpoint, renders the context with SDAR's chat
  template and answers what generate answers."""
  lm_eval = pytest.importorskip("lm_eval")
  from flash_dllm_jax.lm_eval import task_manager
  from flash_dllm_jax.lm_eval.model import cut_at_until
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args={
          "checkpoint": str(hf[0]), "dtype": "float32", "batch_size": 2,
          "chat": True, **ENTRY},
      tasks=["synthetic_gsm"], task_manager=task_manager(
          include_defaults=False), limit=1, log_samples=True)
  [sample] = [s for s in results["samples"]["synthetic_gsm"]
              if s["filter"] == "strict-match"]
  context, args = sample["arguments"][0]
  want = offline(model, [[{"role": "user", "content": context}]], chat=True,
                 batch_size=2)
  assert sample["resps"][0][0] == cut_at_until(want.texts[0], args["until"])
  assert results["config"]["flash_dllm_jax"]["strategy"] == "sdar"


def test_server_answers_equal_offline_generate(hf, model, tmp_path):
  """The server with the official client: completions and chat equal
  offline generate."""
  def offline_ids(prompt, chat):
    row = [{"role": "user", "content": prompt}] if chat else prompt
    return answer_ids(offline(model, [row], chat=chat).tokens_BxG[0],
                      model[1])

  check_answers_equal_offline(hf[0], "sdar", ENTRY, offline_ids, PROMPT,
                              tmp_path / "server.log", "--dtype", "float32")
