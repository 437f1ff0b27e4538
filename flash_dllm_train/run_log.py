"""OUT/metrics.jsonl of a training run (one JSON row per log, eval and fit
event) and the loss plot drawn from it."""

from __future__ import annotations

import json
from pathlib import Path


def scheduled_steps(out_dir: str | Path, tc) -> int:
  """The schedule's total steps: the count a fit_to_time run fitted (its
  last "fit" row in OUT/metrics.jsonl) or tc.steps."""
  fitted = fitted_in_log(Path(out_dir), 1 << 62)
  return fitted if tc.fit_to_time and fitted is not None else tc.steps


def fitted_in_log(out: Path, upto: int) -> int | None:
  """steps of the last "fit" row in OUT/metrics.jsonl up to step `upto`."""
  fits = [r["steps"] for r in read_log(out / "metrics.jsonl", upto)
          if r.get("kind") == "fit"]
  return fits[-1] if fits else None


def read_log(path: Path, upto: int) -> list[dict]:
  """metrics.jsonl entries with step <= upto (a resumed run drops the rest)."""
  if not path.is_file():
    return []
  rows = []
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue  # a half-written last line
    if row.get("step", upto + 1) <= upto:
      rows.append(row)
  return rows


def plot_loss(log: list[dict], png: str | Path, title: str = "") -> None:
  """Loss (left) and masked-token accuracy (right): the running training
  batches, and fixed train / held-out rows scored on their solutions."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  curves = (("train", "train batches (with EOS padding)"),
            ("eval_train", "train rows, solution tokens"),
            ("eval_test", "held-out rows, solution tokens"))
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
  for kind, label in curves:
    rows = [r for r in log if r["kind"] == kind]
    if rows:
      steps = [r["step"] for r in rows]
      ax_loss.plot(steps, [r["loss"] for r in rows], label=label)
      ax_acc.plot(steps, [r["masked_acc"] for r in rows], label=label)
  ax_loss.set(xlabel="step", ylabel="masked-diffusion loss", yscale="log")
  ax_acc.set(xlabel="step", ylabel="masked-token accuracy")
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend()
  fig.suptitle(title or "masked-diffusion training")
  fig.tight_layout()
  fig.savefig(png, dpi=120)
  plt.close(fig)
