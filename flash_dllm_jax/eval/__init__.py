"""Batch evaluation on GSM8K and HumanEval: tasks, sandboxed test execution,
a resumable runner over the compiled `generate`, and reports.

  python -m flash_dllm_jax.eval gsm8k --checkpoint DIR --batch-size 8 ...
"""
