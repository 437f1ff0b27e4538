"""What the command lines say about themselves: the top-level help and its
entry points, each flag's strategies, the checkpoint flag, and docs/cli.md's
list of strategies."""

import re

import pytest

from flash_dllm_jax import architectures, cli, strategies
from tests.paths import ROOT


def _help(capsys, *argv) -> str:
  with pytest.raises(SystemExit) as stop:
    cli.main([*argv, "--help"])
  assert stop.value.code == 0
  return " ".join(capsys.readouterr().out.split())


def test_help_says_what_each_flag_does(capsys, monkeypatch):
  """A sampler flag's help is its declaration (sampling/options.py): what
  it does, its range or choices, its default, the strategies taking it."""
  monkeypatch.setenv("COLUMNS", "1000")
  text = _help(capsys, "generate")
  assert ("--gamma GAMMA Flash-Verify's acceptance level; float in (0, 1]; "
          "default 0.8 [flash-dllm, flash-dllm-onepass, flash-dllm-confident,"
          " llada2-flash] | attention-drift level below which a layer "
          "restarts the recomputation (> 1: every step; <= 0: never); float; "
          "default 0.9 [elastic-cache]") in text
  assert ("--alg ALG which masks a step reveals: random (origin) or by a "
          "confidence measure; one of ('origin', 'maskgit_plus', "
          "'topk_margin', 'entropy'); default 'origin' [dream]") in text
  assert ("--temperature TEMPERATURE 0: greedy; above 0: sample from "
          "softmax(logits / temperature); float in [0, 2]; default 0.0 "
          "[every strategy but diffusion-gemma, diffusion-gemma-flash]"
          ) in text
  assert re.search(r"--seed SEED random seed [^-]*\(default: 0\)", text)
  assert "--stop " not in text and "--end-rule {eos,first}" not in text
  assert "--end-rule END_RULE where the answer ends" in text
  assert "flash-dllm: Flash-dLLM" in text


def test_fixed_fields_are_no_flags(capsys, monkeypatch):
  """A field every strategy of its sampler fixes (cache, verify,
  recompute_all) is no flag of generate or serve, nor named as a valid
  option; every flag names the strategies that take it."""
  monkeypatch.setenv("COLUMNS", "1000")
  fixed_everywhere = {"cache", "verify", "recompute_all"}
  options = strategies.all_options()
  assert not fixed_everywhere & set(options)
  assert all(strategies.strategies_taking(k) for k in options)
  for command in ("generate", "serve"):
    text = _help(capsys, command)
    assert "strategies: none" not in text and "strategies: --" not in text
    for name in fixed_everywhere:
      assert "--" + name.replace("_", "-") + " " not in text, (command, name)
      assert "--no-" + name.replace("_", "-") not in text, (command, name)
    for name in options:
      assert "--" + name.replace("_", "-") in text, (command, name)
  assert cli.main(["generate", "--verify", "--prompt", "x"]) == 2
  err = capsys.readouterr().err
  assert "unknown option(s) --verify" in err
  listed = err.split("strategy options: ")[1]
  assert "--cache" not in listed and "--recompute-all" not in listed
  with pytest.raises(ValueError, match="unknown option"):
    strategies.build_sampler("threshold", "llada", {"cache": "dual"})


def test_serve_takes_what_generate_takes_for_checkpoint(capsys, monkeypatch,
                                                        tmp_path):
  """Both commands take a converted or a Hugging Face directory, default
  $FLASH_DLLM_JAX_CHECKPOINT, and say so."""
  monkeypatch.setenv("COLUMNS", "1000")
  for command in ("generate", "serve"):
    text = _help(capsys, command)
    assert ("--checkpoint CHECKPOINT checkpoint directory: converted, or a "
            "Hugging Face directory of a family: "
            f"{', '.join(architectures.names())} (default: "
            "$FLASH_DLLM_JAX_CHECKPOINT, else") in text, (command, text)
  monkeypatch.setenv(cli.CHECKPOINT_ENV, str(tmp_path / "gone"))
  for command in ("generate", "serve"):
    assert cli.main([command, "--prompt", "x"] if command == "generate"
                    else [command]) == 1
    err = capsys.readouterr().err
    assert f"error: no checkpoint at {tmp_path / 'gone'}" in err, command


def test_no_command_prints_the_help_with_every_entry_point(capsys):
  """`python -m flash_dllm_jax` alone: the top-level help on stdout, exit 0;
  it names generate, serve, lm_eval and every eval and bench script."""
  assert cli.main([]) == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m flash_dllm_jax")
  assert cli.DESCRIPTION in " ".join(out.split())
  for name in ("generate", "serve", "python -m flash_dllm_jax.lm_eval"):
    assert name in out
  scripts = {p.name for p in (ROOT / "scripts").glob("*.py")}
  assert {p for p in scripts if p.startswith(("eval_", "bench_"))} <= {
      c.removeprefix("scripts/") for c, _ in cli.ENTRY_POINTS}
  for command, _ in cli.ENTRY_POINTS:
    if command.startswith("scripts/"):
      assert command.removeprefix("scripts/") in scripts, command
    assert f"python {command} " in out, command
  assert _help(capsys).startswith("usage: python -m flash_dllm_jax")


def test_cli_doc_lists_every_strategy():
  """docs/cli.md names each of the registry's strategies once."""
  section = (ROOT / "docs" / "cli.md").read_text()
  listed = section.split("- `--strategy`: ", 1)[1].split("(default", 1)[0]
  names = re.findall(r"`([a-z0-9.-]+)`", listed)
  assert sorted(names) == sorted(strategies.STRATEGIES), names


def test_serve_help_shows_its_defaults(capsys, monkeypatch):
  monkeypatch.setenv("COLUMNS", "1000")
  text = _help(capsys, "serve")
  for flag in ("--steps-per-call STEPS_PER_CALL", "--max-queue MAX_QUEUE",
               "--steps-while-admitting STEPS_WHILE_ADMITTING"):
    assert re.search(re.escape(flag) + r" [^-]*\(default: \d+\)", text), flag
  # the memory plan's two: what the plan picks, stated
  assert "(default: as many as --gpu-memory-utilization fits)" in text
  assert "default: the model's context less the generation" in text
  assert "slots; default: 0.9)" in text
  assert "--port PORT port to listen on (default: 8000)" in text
  assert "(default: 127.0.0.1)" in text
  assert "(default: None)" not in text  # the strategy's own, unstated
