"""Throughput of one adapter: what lm-eval's metrics do not say.

tokens: generated tokens up to and including each answer's first stop token
(EOS/EOT), before `until` cuts; steps: decoding steps, each row counting
its own; forwards: model forward passes (likelihood forwards counted per
row); decode_s: wall seconds of the `generate` calls; compile_s: the part
of them JAX spent tracing and compiling; tokens/s excludes compile_s.
"""

from __future__ import annotations

import dataclasses





@dataclasses.dataclass
class Throughput:
  """Totals over every call of one kind (generate_until or loglikelihood)."""

  requests: int = 0
  tokens: int = 0
  steps: int = 0
  forwards: int = 0
  decode_s: float = 0.0
  compile_s: float = 0.0

  def add(self, *, requests: int, tokens: int = 0, steps: int = 0,
          forwards: int = 0, wall_s: float = 0.0, compile_s: float = 0.0):
    self.requests += requests
    self.tokens += tokens
    self.steps += steps
    self.forwards += forwards
    self.decode_s += wall_s
    self.compile_s += min(compile_s, wall_s)

  def summary(self) -> dict:
    run_s = self.decode_s - self.compile_s
    return {**dataclasses.asdict(self),
            "tokens_per_s": self.tokens / run_s if run_s > 0 else None,
            "tokens_per_step": self.tokens / self.steps if self.steps else None,
            "forwards_per_request": (self.forwards / self.requests
                                     if self.requests else None)}
