"""What the evaluation scripts' end-to-end tests share: one run of
`scripts/eval_<task>.py` on the tiny checkpoint (3 problems, LLaDA sampler,
gen 16) and the files it writes."""

import json
import subprocess
import sys
from typing import NamedTuple

from tests.paths import ROOT, TINY_CHECKPOINT


class Run(NamedTuple):
  result: subprocess.CompletedProcess
  records: list[dict]
  summary: dict
  settings: dict


def run_script(task: str, out, *flags: str) -> Run:
  """Runs the task's script into `out` (run name "tiny") and checks what
  every run writes: exit 0, one record per problem, the plot."""
  cmd = [sys.executable, str(ROOT / "scripts" / f"eval_{task}.py"),
         "--limit", "3", "--batch-size", "2", "--gen-length", "16",
         "--steps", "8", "--block-length", "8", *flags, "--out-dir", str(out),
         "--run-name", "tiny", "--no-progress",
         "--checkpoint", str(TINY_CHECKPOINT)]
  result = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent)
  assert result.returncode == 0, result.stderr
  records = [json.loads(l) for l in (out / "tiny/records.jsonl").open()]
  assert len(records) == 3
  for r in records:
    assert r["tokens"] >= 1 and r["forwards"] >= 1 and r["wall_s"] > 0
  assert (out / "accuracy_vs_throughput.png").read_bytes()[:4] == b"\x89PNG"
  read = lambda name: json.loads((out / "tiny" / name).read_text())
  return Run(result, records, read("summary.json"), read("run.json"))
