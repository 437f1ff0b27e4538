"""What the engine core (engine_core.py) refuses, and when it gives up:
the admission errors the routes turn into HTTP statuses, and the restart
budget of its supervised thread."""

from __future__ import annotations


class QueueFull(Exception):
  """The waiting queue is at its limit (HTTP 429)."""


class Draining(Exception):
  """The server is shutting down and admits nothing new (HTTP 503)."""


class EngineFailed(Exception):
  """The engine failed for good and admits nothing new (HTTP 503)."""


MAX_RESTARTS = 3  # engine restarts allowed within RESTART_WINDOW_S
RESTART_WINDOW_S = 60.0


def recent_restarts(restarts: list[float], now: float
                    ) -> tuple[list[float], bool]:
  """(the restarts, time.monotonic() values, within RESTART_WINDOW_S of
  `now`; whether a failure now is fatal: MAX_RESTARTS of them)."""
  kept = [t for t in restarts if now - t < RESTART_WINDOW_S]
  return kept, len(kept) >= MAX_RESTARTS
