"""The project as an lm-evaluation-harness model (the `lm-eval` extra).

Importing this package registers the model `flash_dllm_jax` with lm-eval
(model.py). TASKS_DIR holds task configs that read the project's local data
(gsm8k_local, synthetic_gsm, synthetic_gsm_ood); `task_manager()` is an
lm-eval TaskManager that knows them:

  import lm_eval, flash_dllm_jax.lm_eval as fl
  results = lm_eval.simple_evaluate(
      model="flash_dllm_jax", model_args="pretrained=DIR,strategy=flash-dllm",
      tasks=["synthetic_gsm"], task_manager=fl.task_manager(), limit=8)

From the shell: `python -m flash_dllm_jax.lm_eval --model flash_dllm_jax
--tasks gsm8k_local ...` (lm-eval's own CLI with these tasks included).
"""

from pathlib import Path

from flash_dllm_jax.lm_eval.model import FlashDLLMJax

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def task_manager(**kwargs):
  """lm_eval.tasks.TaskManager with TASKS_DIR included (kwargs: its own)."""
  from lm_eval.tasks import TaskManager
  extra = kwargs.pop("include_path", None) or []
  extra = [extra] if isinstance(extra, (str, Path)) else list(extra)
  return TaskManager(include_path=[str(TASKS_DIR), *map(str, extra)],
                     **kwargs)


__all__ = ["FlashDLLMJax", "TASKS_DIR", "task_manager"]
