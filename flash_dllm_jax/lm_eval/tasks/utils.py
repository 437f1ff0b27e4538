"""The `!function utils.*` datasets of the task yamls here (tasks_data.py)."""

from flash_dllm_jax.lm_eval.tasks_data import (gsm8k, synthetic_gsm,  # noqa: F401
                                               synthetic_gsm_ood)
