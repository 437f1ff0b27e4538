"""What the Mosaic GPU kernel folders share: the lowering semantics they
set and the interpret mode's (private, as of jax 0.11) entry points, wrapped
here in one place."""

from jax.experimental.pallas import mosaic_gpu as plgpu

# Lane: loads and stores take wgmma's register layout, no inference (the
# other choice, Warpgroup, infers layouts; the default changed in 0.11).
SEMANTICS = plgpu.LoweringSemantics.Lane


def interpret_params():
  """Mosaic GPU's interpret-mode parameters (private as of jax 0.11)."""
  from jax._src.pallas.mosaic_gpu.interpret import params
  return params.InterpretGPUParams()


def reset_interpret_state():
  """Clears the interpreter's shared state, which an exception inside an
  interpreted kernel leaves behind."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
  interpret_pallas_call.reset_gpu_interpret_mode_state()
