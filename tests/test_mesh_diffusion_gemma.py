"""diffusion-gemma under a data mesh (two forced host CPU devices): the
rows split over `data` give every row its one-device tokens, steps and
logprobs; `model=` is refused with one error (the family does not split
its weights)."""

from tests.mesh_case import run_script

SCRIPT = r'''
import jax, numpy as np
assert len(jax.devices()) == 2, jax.devices()
from flash_dllm_jax import checkpoint, compilation
compilation.enable_persistent_cache(compilation.default_cache_dir())
from flash_dllm_jax.generate import generate
from tests.diffusion_gemma_case import PROMPTS, SEEDS, SETTINGS, TINY
model = checkpoint.load(TINY, dtype="float32")
one = generate(model, PROMPTS[:4], seed=SEEDS[:4], logprobs=True, **SETTINGS)
two = generate(model, PROMPTS[:4], seed=SEEDS[:4], logprobs=True,
               mesh="data=2", **SETTINGS)
for name in ("tokens_BxG", "steps_B", "forwards_B", "logprobs_BxG"):
  assert np.array_equal(getattr(one, name), getattr(two, name)), name
try:
  generate(model, PROMPTS[:2], seed=SEEDS[:2], mesh="model=2", **SETTINGS)
except ValueError as e:
  print("refused:", e)
'''


def test_data_parallel_rows_keep_their_one_device_answers():
  # XLA's default flags: the one-device decode is the program the family's
  # other modules compile (diffusion_gemma_case), loaded from the run's cache.
  out = run_script(SCRIPT, devices=2, quick=False)
  assert ("refused: mesh model=2: the diffusion_gemma family does not split "
          "its weights") in out
