"""A quick accuracy check of a trained model: decode held-out problems with
the architecture's default sampler and score them the way GSM8K is scored."""

from __future__ import annotations

from typing import Sequence

from flash_dllm_jax.eval.tasks.gsm8k import extract_answer, target_of
from flash_dllm_jax.generate import generate


def solve_accuracy(model, problems: Sequence[dict], batch_size: int = 64,
                   **options) -> tuple[float, list]:
  """(accuracy, [(question, output, predicted, target)]) over `problems`
  ({"question", "answer"} rows), with the bare question as the chat user
  turn, decoded by the architecture's default sampler built from
  `options` (gen_length, steps, block_length, ...). `model` is what
  `flash_dllm_jax.load` returns."""
  if not problems:
    raise ValueError("solve_accuracy needs at least one problem")
  results = []
  for start in range(0, len(problems), batch_size):
    chunk = problems[start:start + batch_size]
    out = generate(model, [p["question"] for p in chunk], chat=True,
                   **options)
    for p, text in zip(chunk, out.texts):
      results.append((p["question"], text, extract_answer(text),
                      target_of(p["answer"])))
  correct = sum(pred == target for _, _, pred, target in results)
  return correct / len(results), results
