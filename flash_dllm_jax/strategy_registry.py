"""The strategy registry's dict: each registered family's own strategies
(its folder's strategies.py), then the shared ones (strategies.SHARED),
kept in sync with the architecture registry at each lookup."""

from __future__ import annotations

from flash_dllm_jax import architectures


class StrategyRegistry(dict):
  """Each registered family's own strategies (its folder's), then SHARED,
  in sync with the architecture registry: a family registered later
  (architectures.load_folder) adds its strategies at the next lookup."""

  def __init__(self, shared):
    super().__init__()
    self._shared, self._families, self._own = tuple(shared), None, ()

  def _sync(self) -> None:
    families = tuple(architectures.ARCHITECTURES.values())
    if families == self._families:
      return
    kept = {n: s for n, s in dict.items(self) if n not in self._own}
    own = [s for spec in families if spec.strategies is not None
           for s in spec.strategies()]
    dict.clear(self)
    for strategy in (*own, *self._shared):
      if dict.__contains__(self, strategy.name):
        raise ValueError(f"strategy {strategy.name!r} is registered twice")
      dict.__setitem__(self, strategy.name, strategy)
    for name, strategy in kept.items():  # entries added by hand
      dict.__setitem__(self, name, strategy)
    self._families, self._own = families, tuple(s.name for s in own)

  def __getitem__(self, name):
    self._sync()
    return dict.__getitem__(self, name)

  def __contains__(self, name):
    self._sync()
    return dict.__contains__(self, name)

  def __iter__(self):
    self._sync()
    return dict.__iter__(self)

  def __len__(self):
    self._sync()
    return dict.__len__(self)

  def get(self, name, default=None):
    self._sync()
    return dict.get(self, name, default)

  def keys(self):
    self._sync()
    return dict.keys(self)

  def values(self):
    self._sync()
    return dict.values(self)

  def items(self):
    self._sync()
    return dict.items(self)
