"""The README: its two commands on the first screen, its families from the
registry, links that resolve, and its quickstart blocks (each after a
`<!-- quickstart: NAME -->` marker) run as pasted on the shipped model.

The quickstart blocks run with the test's interpreter first on PATH (so
`python` and `flash-dllm-jax` are this environment's) and this tree first
on PYTHONPATH. Two changes only: the server's port 8000 becomes a free
one (tests run in parallel), and the evaluation's --out-dir a temporary
folder. The server block runs in bash; the Python blocks, and the main
command's generate, the command-line block and the evaluation (each one
`flash-dllm-jax` / `python -m` command line) run their main in this
process, without a fresh Python and JAX import each.
The main command, the Python block and the command-line block decode one
program (Flash-dLLM at gen 192, one short prompt): compiled once, then
reused in this process.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flash_dllm_data.gsm_format import check_solution
from flash_dllm_jax import architectures, cli
from tests.paths import ROOT
from tests.serve_case import free_port

README = (ROOT / "README.md").read_text()
QUICKSTART = ("python", "cli", "serve", "client", "eval")


def block(marker: str) -> str:
  """The code of the fenced block right after `marker`."""
  rest = README.split(marker + "\n", 1)[1]
  assert rest.startswith("```"), f"no code block right after {marker}"
  return rest.split("\n", 1)[1].split("\n```", 1)[0] + "\n"


def quickstart(name: str) -> str:
  return block(f"<!-- quickstart: {name} -->")


def env() -> dict:
  bindir = str(Path(sys.executable).parent)
  return {**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"],
          "PYTHONPATH": os.pathsep.join(
              [str(ROOT)] + ([os.environ["PYTHONPATH"]]
                             if os.environ.get("PYTHONPATH") else []))}


def run_python(code: str, capsys) -> str:
  """Runs a Python block in a fresh namespace from the repository root."""
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
  finally:
    os.chdir(cwd)
  return capsys.readouterr().out


def answer_of(text: str) -> str:
  """The worked solution: the lines from the first `<<` step to `#### N`."""
  match = re.search(r"[^\n]*<<.*?#### -?\d+", text, re.S)
  assert match, text
  return match.group(0)


def test_first_screen_holds_the_two_commands():
  lines = README.splitlines()
  assert len(lines) <= 700, len(lines)
  for marker in ("<!-- main-command -->", "<!-- test-command -->"):
    start = lines.index(marker)
    end = lines.index("```", start + 2)
    assert end < 40, (marker, end)
  ci = (ROOT / ".ci" / "run").read_text()
  extract = re.search(r"^cmd=\$\((awk .*)\)$", ci, re.M).group(1)
  cmd = subprocess.run(["bash", "-c", extract], cwd=ROOT, check=True,
                       capture_output=True, text=True).stdout.strip()
  assert cmd == block("<!-- test-command -->").strip()
  assert cmd.startswith("python3 -m venv .venv && ") and " pytest " in cmd


def test_families_are_the_registry():
  line = README.split("<!-- families -->\n", 1)[1].split(
      "\n", 1)[0]
  assert tuple(re.findall(r"`([a-z0-9_]+)`", line.split(":", 1)[1])
               ) == architectures.names(), line


def test_benchmarks_fits_its_budget():
  """BENCHMARKS.md keeps one table per topic; older runs' tables live
  beside their raw files under benchmarks/results/, linked."""
  text = (ROOT / "BENCHMARKS.md").read_text()
  assert len(text.splitlines()) <= 450
  assert re.search(r"\]\(benchmarks/results/[^)]+\.md\)", text)


def test_links_resolve():
  """Every relative link of the README, BENCHMARKS.md, docs/ and the
  results' notes names a file that exists."""
  pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md",
           *sorted((ROOT / "docs").glob("*.md")),
           *sorted((ROOT / "benchmarks" / "results").rglob("*.md"))]
  for page in pages:
    for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
      if "://" not in target:
        assert (page.parent / target).exists(), (page.name, target)


def test_quickstart_blocks_are_the_tested_ones():
  assert re.findall(r"<!-- quickstart: ([a-z]+) -->", README) == list(
      QUICKSTART)


@pytest.mark.slow
def test_main_command_prints_the_worked_solution(capsys):
  """The main command's generate part, in this process: Flash-dLLM writes
  every step right and ends with the right number. It compiles the program
  the quickstart's Python and command-line blocks run next."""
  argv = shlex.split(block("<!-- main-command -->").split(
      "-m flash_dllm_jax ", 1)[1])
  assert argv[:3] == ["generate", "--strategy", "flash-dllm"], argv
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  for step in ("<<6*7=42>>42", "<<42-7=35>>35", "<<35-3=32>>32",
               "<<32/4=8>>8"):
    assert step in out, out
  assert re.search(r"#### 8\s*$", out), out


@pytest.mark.slow
def test_quickstart_python_and_command_line_give_the_worked_solution(capsys):
  out = run_python(quickstart("python"), capsys)
  solution = answer_of(out)
  assert check_solution(solution) and solution.endswith("#### 104"), out
  # `flash-dllm-jax` is cli.main (pyproject's script; the server block
  # runs it as pasted): its generate in this process, as the main command's
  argv = shlex.split(quickstart("cli"))
  assert argv[0] == "flash-dllm-jax", argv
  assert cli.main(argv[1:]) == 0
  assert answer_of(capsys.readouterr().out) == solution  # one program


@pytest.mark.slow
def test_quickstart_server_answers_the_openai_client(capsys, tmp_path):
  port = str(free_port())
  log = open(tmp_path / "serve.log", "w")
  start = subprocess.Popen(
      ["bash", "-c", quickstart("serve").replace("8000", port)], cwd=ROOT,
      env=env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  try:
    try:
      assert start.wait(timeout=300) == 0  # the block returns once ready
    except subprocess.TimeoutExpired:
      raise AssertionError((tmp_path / "serve.log").read_text()[-3000:])
    out = run_python(quickstart("client").replace("8000", port), capsys)
    solution = answer_of(out)
    assert check_solution(solution) and solution.endswith("#### 77"), out
  finally:
    _stop_group(start.pid)
    log.close()


def _stop_group(pgid: int) -> None:
  """Ends the block's process group (the backgrounded server)."""
  for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
    try:
      os.killpg(pgid, sig)
    except ProcessLookupError:
      return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
      try:
        os.killpg(pgid, 0)
      except ProcessLookupError:
        return
      time.sleep(0.2)


@pytest.mark.slow
def test_quickstart_evaluation_writes_its_run(tmp_path, capsys):
  """The block's one `python -m flash_dllm_jax.eval` command, its main in
  this process (as the main command's: no fresh Python and JAX import)."""
  from flash_dllm_jax.eval import cli as eval_cli
  code = quickstart("eval")
  assert "--out-dir runs/eval/quickstart" in code
  argv = shlex.split(code.replace("runs/eval/quickstart", str(tmp_path)))
  assert argv[:3] == ["python", "-m", "flash_dllm_jax.eval"], code
  cwd = os.getcwd()
  os.chdir(ROOT)  # the block's paths are the repository's
  try:
    assert eval_cli.main(argv[3:]) == 0, capsys.readouterr().err[-3000:]
  finally:
    os.chdir(cwd)
  run = capsys.readouterr()
  (summary_path,) = tmp_path.glob("*/summary.json")
  summary = json.loads(summary_path.read_text())
  records = [json.loads(r) for r in (summary_path.parent / "records.jsonl"
                                      ).read_text().splitlines()]
  assert len(records) == summary["problems"] == 4
  solved = sum(r["correct"] for r in records)
  assert solved == summary["correct"]
  assert f"accuracy {solved}/4;" in run.err, run.err[-2000:]
  assert "| flash-dllm |" in (tmp_path / "results.md").read_text()
