"""The server's Prometheus metrics (prometheus-client), on their own registry."""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

disable_created_metrics()  # no *_created samples

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30, 60, 120)

OUTCOMES = ("ok", "invalid", "rejected", "deadline", "cancelled", "shutdown",
            "error")


class Metrics:
  """Names are prefixed `dllm_`. Round trips per generated token are
  `dllm_host_round_trips_total / dllm_generated_tokens_total`."""

  def __init__(self):
    self.registry = r = CollectorRegistry()
    self.queue_length = Gauge("dllm_queue_length",
                              "requests waiting for a slot", registry=r)
    self.busy_slots = Gauge("dllm_busy_slots", "slots holding a request",
                            registry=r)
    self.preparing = Gauge("dllm_preparing_requests",
                           "requests being tokenized and checked (in worker "
                           "threads)", registry=r)
    self.slots = Gauge("dllm_slots", "slots on the device", registry=r)
    self.requests = Counter("dllm_requests", "finished requests by outcome",
                            ["outcome"], registry=r)
    for outcome in OUTCOMES:
      self.requests.labels(outcome)
    self.generated_tokens = Counter("dllm_generated_tokens",
                                    "completion tokens sent", registry=r)
    self.prompt_tokens = Counter("dllm_prompt_tokens", "prompt tokens admitted",
                                 registry=r)
    self.decode_steps = Counter("dllm_decode_steps",
                                "decoding steps run on the device", registry=r)
    self.round_trips = Counter(
        "dllm_host_round_trips",
        "returns of the compiled decode loop to the host", registry=r)
    self.text_revisions = Counter(
        "dllm_text_revisions", "answers whose final text did not extend the "
        "text already streamed (must stay 0)", registry=r)
    self.ttft = Histogram("dllm_time_to_first_token_seconds",
                          "arrival to the first final token",
                          buckets=_LATENCY_BUCKETS, registry=r)
    self.latency = Histogram("dllm_request_latency_seconds",
                             "arrival to the last token",
                             buckets=_LATENCY_BUCKETS, registry=r)
    self.admission = Histogram("dllm_admission_latency_seconds",
                               "arrival to taking a slot on the device",
                               buckets=_LATENCY_BUCKETS, registry=r)
    self.host_gap = Histogram(
        "dllm_host_gap_seconds", "a call's output read to the next call "
        "dispatched (the device waits on the host meanwhile)",
        buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                 0.1), registry=r)
    self.cycle = Histogram("dllm_cycle_seconds",
                           "one call of the compiled loop (host round trip)",
                           buckets=_LATENCY_BUCKETS, registry=r)

  # Observers of the engine loop (engine_core.EngineCore) ------------------
  def observe_loaded(self, loaded, started: float, seconds: float,
                     iters: int) -> None:
    """The requests a call loaded (scheduler.Placement.loaded: request,
    loop step): admission latency (the load's time taken as `started` plus
    its share of the call's `seconds` by steps), prompt tokens."""
    for r, step in loaded:
      at = started + seconds * min(step / max(iters, 1), 1.0)
      self.admission.observe(max(at - r.arrived, 0.0))
      self.prompt_tokens.inc(len(r.ids))

  def observe_step(self, step, out, seconds: float, now: float) -> None:
    """A device call's outcome (scheduler.EngineCoreOutputs, applied;
    model_runner.ModelRunnerOutput; its seconds)."""
    self.cycle.observe(seconds)
    self.round_trips.inc()
    self.decode_steps.inc(out.iters)
    seen = set()
    for r, ev in step.events:
      if r.first_token_at == now and r.number not in seen:
        seen.add(r.number)
        self.ttft.observe(now - r.arrived)
      if ev.done:
        self.generated_tokens.inc(len(ev.token_ids))
    for r in step.finished:
      if r.answer.revised:
        self.text_revisions.inc()

  def render(self) -> bytes:
    return generate_latest(self.registry)
