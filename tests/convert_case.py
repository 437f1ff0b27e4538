"""The fixtures the conversion tests share: tiny HF sources (LLaDA and
Dream, float32 and bfloat16) with their oracle models."""

import shutil
from pathlib import Path

import pytest

from tests import hf_fixtures

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path("/work/shared/reference")
WRITERS = {"llada": hf_fixtures.write_llada, "dream": hf_fixtures.write_dream}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """{(arch, dtype): (src dir, oracle)}, written once per module."""
  root = tmp_path_factory.mktemp("hf")
  return {(arch, dtype): write(root / f"{arch}-{dtype}", dtype=dtype)
          for arch, write in WRITERS.items()
          for dtype in ("float32", "bfloat16")}


@pytest.fixture
def llada_src(sources, tmp_path):
  """A private, editable copy of the float32 LLaDA source."""
  return Path(shutil.copytree(sources["llada", "float32"][0], tmp_path / "src"))
