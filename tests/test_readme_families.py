"""User-facing text names the model families from the registry, never from
a hand-written list: the help of every command and sub-command, the
package docstring, pyproject's description, the README's opening and every
error message raised in the package and the scripts. A list is two or more
family names joined by `,`, `/`, `and` or `or`; the registry's own list
(`architectures.names()` joined) is the one allowed."""

import argparse
import ast
import re
import tomllib

import pytest

import flash_dllm_jax
from flash_dllm_jax import architectures, cli, strategies
from flash_dllm_jax.eval import cli as eval_cli
from tests.paths import ROOT

NAMES = architectures.names()
REGISTRY_LIST = ", ".join(NAMES)


def _family_words() -> list[str]:
  """The first word of each family's label (LLaDA-8B: LLaDA), as prose
  writes a family; the lower-case registry names are also strategy names
  (`llada`, `dream`), whose lists the registry writes."""
  words = {re.split(r"[\s,(/-]", architectures.get(name).label)[0]
           for name in NAMES}
  return sorted(map(re.escape, words), key=len, reverse=True)


FAMILY = r"\b(?:%s)(?:[\w.]*)" % "|".join(_family_words())
LIST = re.compile(rf"{FAMILY}(?:'s)?\s*(?:,|/|\band\b|\bor\b)\s*{FAMILY}")


def hand_written_lists(text: str) -> list[str]:
  text = " ".join(text.replace(REGISTRY_LIST, "<registry>").split())
  return LIST.findall(text)


def _helps(parser: argparse.ArgumentParser, prog: str):
  yield prog, parser.format_help()
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for name, sub in action.choices.items():
        yield from _helps(sub, f"{prog} {name}")


def test_the_pattern_finds_hand_written_lists():
  """The check itself: it catches the lists it is for and lets the
  registry's own list and single names through."""
  for text in ("diffusion LLMs (LLaDA, Dream) in JAX", "a LLaDA / Dream "
               "checkpoint", "LLaDA and Dream", "LLaDA2's or Dream's",
               "DiffusionGemma / LLaDA2"):
    assert hand_written_lists(text), text
  for text in (f"families: {REGISTRY_LIST}.", "LLaDA's reference sampler",
               "Dream's entropy rule; LLaDA-8B shapes"):
    assert not hand_written_lists(text), text


def test_command_help_names_no_hand_written_family_list(capsys):
  texts = [*_helps(cli._parser(), "python -m flash_dllm_jax"),
           *_helps(eval_cli.parser(), "python -m flash_dllm_jax.eval")]
  import runpy
  convert = runpy.run_path(str(ROOT / "scripts" / "convert_hf.py"))
  with pytest.raises(SystemExit):
    convert["main"](["--help"])
  texts.append(("scripts/convert_hf.py", capsys.readouterr().out))
  assert {p for p, _ in texts} >= {
      "python -m flash_dllm_jax generate", "python -m flash_dllm_jax serve",
      "python -m flash_dllm_jax.eval gsm8k"}
  for prog, text in texts:
    assert not hand_written_lists(text), (prog, hand_written_lists(text))
  assert REGISTRY_LIST in " ".join(texts[0][1].split())  # the description
  assert REGISTRY_LIST in " ".join(texts[-1][1].split())


def test_package_pyproject_and_readme_name_no_hand_written_list():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  readme = (ROOT / "README.md").read_text()
  opening = readme.split("<!-- main-command -->", 1)[0]
  for where, text in (("package docstring", flash_dllm_jax.__doc__),
                      ("pyproject description", project["description"]),
                      ("README opening", opening)):
    assert not hand_written_lists(text), (where, hand_written_lists(text))


def _raised_strings(tree: ast.AST):
  """The string parts of every `raise` and `parser.error(...)` call."""
  for node in ast.walk(tree):
    calls = []
    if isinstance(node, ast.Raise) and node.exc is not None:
      calls.append(node.exc)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "error"):
      calls.append(node)
    for call in calls:
      parts = [n.value for n in ast.walk(call)
               if isinstance(n, ast.Constant) and isinstance(n.value, str)]
      if parts:
        yield node.lineno, " ".join(parts)


def test_error_messages_name_no_hand_written_family_list():
  files = [*sorted((ROOT / "flash_dllm_jax").rglob("*.py")),
           *sorted((ROOT / "scripts").glob("*.py"))]
  found = [(f"{path.relative_to(ROOT)}:{line}", hand_written_lists(text))
           for path in files
           for line, text in _raised_strings(ast.parse(path.read_text()))
           if hand_written_lists(text)]
  assert not found, found


def test_errors_that_list_families_take_the_registry():
  """The errors that do list families (an unknown model_type, a strategy
  that does not decode the checkpoint's family) list the registry's."""
  with pytest.raises(ValueError) as unknown:
    architectures.for_model_type("no-such-model")
  for name in NAMES:
    assert architectures.get(name).label in str(unknown.value)
  with pytest.raises(ValueError) as wrong:
    strategies.build_sampler("dream", "llada", {})
  assert not hand_written_lists(str(wrong.value)), str(wrong.value)
