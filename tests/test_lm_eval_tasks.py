"""The shipped lm-eval task configs: lm-eval's gsm8k definition over local
data, the project's prompts, and lm-eval's scores of the shipped model
equal to the project's records scored under lm-eval's rules."""

import json
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402

from flash_dllm_jax.cli import DEFAULT_CHECKPOINT  # noqa: E402
from flash_dllm_jax.eval.tasks.gsm8k import GSM8K  # noqa: E402
from flash_dllm_jax.lm_eval import TASKS_DIR, scoring, task_manager  # noqa: E402
from tests.paths import ROOT  # noqa: E402

LM_EVAL_GSM8K = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
# The shipped model computes more than it compiles: XLA's default level.
pytestmark = pytest.mark.usefixtures("optimised")


def local_tasks(**kwargs):
  """The project's tasks alone: indexing lm-eval's own task files costs
  seconds per call, and these tests use none of them."""
  return task_manager(include_defaults=False, **kwargs)
DATASET_KEYS = {"task", "tag", "dataset_path", "dataset_name",
                "custom_dataset"}


def _definition(path: Path) -> dict:
  cfg = load_yaml(path, resolve_func=False)
  return {k: v for k, v in cfg.items() if k not in DATASET_KEYS}


def test_gsm8k_local_is_lm_evals_gsm8k_on_local_data():
  ours = _definition(TASKS_DIR / "gsm8k_local.yaml")
  assert ours == _definition(LM_EVAL_GSM8K)
  for name in ("synthetic_gsm", "synthetic_gsm_ood"):
    synthetic = _definition(TASKS_DIR / f"{name}.yaml")
    lm_evals = {k: v for k, v in _definition(LM_EVAL_GSM8K).items()
                if k not in ("training_split", "fewshot_split")}
    assert synthetic == {**lm_evals, "num_fewshot": 0}


@pytest.mark.slow
def test_local_tasks_build_the_project_prompts():
  tm = local_tasks()
  tasks = tm.load(["gsm8k_local", "synthetic_gsm_ood"])["tasks"]
  gsm = tasks["gsm8k_local"]
  gsm.set_fewshot_seed(1234)  # simple_evaluate's default fewshot seed
  gsm.build_all_requests(limit=3, rank=0, world_size=1)
  want = GSM8K().problems(lambda user, prefix="": user + prefix)
  assert [i.args[0] for i in gsm.instances] == [p.prompt for p in want[:3]]
  ood = tasks["synthetic_gsm_ood"]
  assert len(ood.test_docs()) == 500
  first = json.loads((ROOT / "data/synthetic_gsm/ood.jsonl").open().readline())
  assert ood.test_docs()[0]["question"] == first["question"]


def test_data_dir_is_checked():
  from flash_dllm_jax.lm_eval.tasks_data import synthetic_gsm
  with pytest.raises(FileNotFoundError, match="/nowhere"):
    synthetic_gsm(data_dir="/nowhere")


@pytest.mark.slow
def test_shipped_model_scores_equal_the_project_records(tmp_path):
  from flash_dllm_jax.checkpoint import load
  from flash_dllm_jax.eval.runner import run_eval
  from flash_dllm_jax.strategies import build_sampler

  options = {"gen_length": 96, "block_length": 32, "threshold": 0.9}
  model = load(DEFAULT_CHECKPOINT)
  task = GSM8K(ROOT / "data" / "synthetic_gsm", num_fewshot=0, chat=True)
  sampler = build_sampler("threshold", "llada", options)
  run_eval(task, model, sampler, tmp_path, {"test": True}, batch_size=4,
           limit=4, progress=False)
  records = [json.loads(line)
             for line in (tmp_path / "records.jsonl").read_text().splitlines()]
  records = {int(r["id"].split("/")[1]): r for r in records}

  args = {"checkpoint": str(DEFAULT_CHECKPOINT), "strategy": "threshold",
          "batch_size": 4, "chat": True, **options}
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args=args, tasks=["synthetic_gsm"],
      task_manager=local_tasks(), limit=4, log_samples=True)
  samples = results["samples"]["synthetic_gsm"]
  pairs = []
  for s in samples:
    record = records[s["doc_id"]]
    assert s["resps"][0][0] == record["output"]  # the same answer text
    want = scoring.score(record["output"], s["doc"]["answer"])
    assert s["exact_match"] == float(want[s["filter"]]), s
    if s["filter"] == "strict-match":
      pairs.append((record["output"], s["doc"]["answer"]))
  assert len(pairs) == 4
  accuracy = scoring.accuracy(pairs)
  metrics = results["results"]["synthetic_gsm"]
  for name in ("strict-match", "flexible-extract"):
    assert metrics[f"exact_match,{name}"] == pytest.approx(accuracy[name])
  assert accuracy["flexible-extract"] > 0  # the model does solve some


@pytest.mark.parametrize("output", [
    "He pays 3*4 = <<3*4=12>>12.\n#### 12", "#### 1,080.00", "#### $18.",
    "So she has 7 apples and 5 pears, 12 fruit.", "no number", "#### -3",
    "It is 12.\n#### 12\n#### 13", "3.5 hours, then 4.",
])
def test_scoring_follows_lm_evals_filters_and_metric(output):
  from lm_eval.api.metrics import exact_match_hf_evaluate
  from lm_eval.filters.extraction import RegexFilter
  cfg = load_yaml(LM_EVAL_GSM8K, resolve_func=False)
  metric = {k: v for k, v in cfg["metric_list"][0].items()
            if k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")}
  answer = "Some steps.\n#### 12"
  for flt in cfg["filter_list"]:
    regex = flt["filter"][0]
    extracted = RegexFilter(regex["regex_pattern"],
                            regex.get("group_select", 0)).apply(
        [[output]], [{}])[0][0]
    want = exact_match_hf_evaluate([extracted], [answer], **metric)
    assert scoring.score(output, answer)[flt["name"]] == bool(
        want["exact_match"]), (flt["name"], extracted)
