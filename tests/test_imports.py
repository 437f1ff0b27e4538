"""The inference package and its kernels have no import circle and import
only what their layer may, read statically (tests/import_graph.py; nothing
is imported, JAX included; docs/imports.md)."""

import pathlib
import re
import sys
import textwrap
import tomllib

import pytest

from tests import import_graph
from tests.paths import ROOT

PACKAGES = ("flash_dllm_jax", "pallas_kernels")
# Training, corpora and benchmarks build on inference, never the reverse.
ABOVE = ("flash_dllm_train", "flash_dllm_data", "flash_dllm_bench")
IMPORT_NAMES = {"orbax_checkpoint": "orbax"}  # distribution -> module

EDGES = import_graph.edges(ROOT, PACKAGES)


def test_no_import_circle():
  circles = [import_graph.describe(c) for c in import_graph.cycles(EDGES)]
  if circles:
    pytest.fail(f"{len(circles)} import circle(s), one a line (module:line "
                "of each import):\n" + "\n".join(circles), pytrace=False)


def test_kernels_never_import_the_engine():
  bad = [f"{e.source}:{e.line} imports {e.target}" for e in EDGES
         if e.source.startswith("pallas_kernels")
         and e.target.startswith("flash_dllm_jax")]
  if bad:
    pytest.fail("\n".join(bad), pytrace=False)


def test_inference_never_imports_training_data_or_benchmarks():
  bad = [f"{e.source}:{e.line} imports {e.target}"
         for e in import_graph.external(ROOT, PACKAGES) if e.target in ABOVE]
  if bad:
    pytest.fail("\n".join(bad), pytrace=False)


def test_no_family_folder_imports_another():
  """A family folder (architectures/<family>/) imports no other family's
  folder: what several families share lives beside them (qwen2_chat.py,
  qwen2_tensors.py) or in the shared packages."""
  base = "flash_dllm_jax.architectures."
  folders = {p.name for p in (ROOT / "flash_dllm_jax" / "architectures")
             .iterdir() if (p / "__init__.py").exists()}
  family = lambda module: (module.removeprefix(base).split(".")[0]
                           if module.startswith(base) else None)
  bad = [f"{e.source}:{e.line} imports {e.target}" for e in EDGES
         if family(e.source) in folders and family(e.target) in folders
         and family(e.source) != family(e.target)]
  if bad:
    pytest.fail("\n".join(bad), pytrace=False)


def test_the_package_and_its_commands_load_without_optional_extras():
  """`import flash_dllm_jax` and `python -m flash_dllm_jax` load only the
  standard library and pyproject's dependencies (jax's ml_dtypes with it):
  the extras (serve, lm-eval, eval) are imported inside the functions that
  use them."""
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  names = {re.split(r"[^A-Za-z0-9_-]", d)[0].replace("-", "_")
           for d in project["dependencies"]}
  names = {IMPORT_NAMES.get(n, n) for n in names}
  allowed = set(sys.stdlib_module_names) | names | {"ml_dtypes"}
  loaded = import_graph.loaded(EDGES, ("flash_dllm_jax", "flash_dllm_jax.cli",
                                       "flash_dllm_jax.__main__"))
  bad = sorted(f"{e.source}:{e.line} imports {e.target}"
               for e in import_graph.external(ROOT, PACKAGES)
               if e.source in loaded and not e.nested
               and e.target not in allowed)
  if bad:
    pytest.fail("loaded with the package or its commands, outside "
                "pyproject's dependencies (import them where used):\n"
                + "\n".join(bad), pytrace=False)


def test_the_graph_sees_every_form_of_import(tmp_path: pathlib.Path):
  """A package with one circle per form of import (module level, in a
  function, relative, `from pkg import module`, importlib with a literal
  name, through a package's __init__) and imports that close none."""
  files = {
      "pkg/__init__.py": "from pkg.sub import leaf\n",
      "pkg/a.py": "from . import b\n",
      "pkg/b.py": "def f():\n  import pkg.a\n",
      "pkg/c.py": "import importlib\nM = importlib.import_module('pkg.d')\n",
      "pkg/d.py": "from pkg import c\n",
      "pkg/sub/__init__.py": "from ..sub.leaf import X\n",
      "pkg/sub/leaf.py": "X = 1\nfrom pkg.e import Y\n",
      "pkg/e.py": "Y = 2\n",
      "pkg/f.py": "from pkg.sub.leaf import X\n",
      "pkg/g.py": "import os, json\nfrom pkg.e import Y as Z\n",
  }
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(textwrap.dedent(text))
  (tmp_path / "pkg/e.py").write_text("Y = 2\nfrom pkg.f import X\n")
  edges = import_graph.edges(tmp_path, ("pkg",))
  lines = [import_graph.describe(c) for c in import_graph.cycles(edges)]
  assert lines == [
      "pkg.a:1 -> pkg.b:2 (in a function) -> pkg.a",
      "pkg.c:2 -> pkg.d:1 -> pkg.c",
      "pkg.e:2 -> pkg.f:1 -> pkg.sub.leaf:2 -> pkg.e",
  ]
  assert import_graph.Edge("pkg.g", "os", 1, False) in import_graph.external(
      tmp_path, ("pkg",))
  assert import_graph.loaded(edges, ("pkg.b",)) == {"pkg.b"}
  assert import_graph.loaded(edges, ("pkg.f",)) == {
      "pkg.f", "pkg.sub", "pkg.sub.leaf", "pkg.e"}
