"""The load side of scripts/bench_serve.py: streamed completions under
Poisson arrivals (aiohttp, as vLLM's benchmark client: httpx's async client
spends about 6 ms of CPU a streamed request, a ceiling near 100 requests/s),
in a client process apart from the server's, and the row of measurements
one load makes (throughput, TTFT, latency, the server's /metrics, its CPU
per request by thread). No JAX here: the spawned client imports only this."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families


def scrape(url) -> dict:
  text = httpx.get(url + "/metrics").text
  return {s.name: s.value for f in text_string_to_metric_families(text)
          for s in f.samples if not s.labels}


async def one(client, url, name, prompt, start_at, t0, first_only=False):
  """(sent, TTFT, latency, completion tokens, done) of one streamed
  completion; first_only: leaves at the first token (the server aborts the
  rest), latency is then TTFT."""
  await asyncio.sleep(max(0.0, start_at - (time.perf_counter() - t0)))
  sent, first, tokens = time.perf_counter(), None, 0
  body = {"model": name, "prompt": prompt, "stream": True}
  async with client.post(url + "/v1/completions", json=body) as r:
    r.raise_for_status()
    async for raw in r.content:  # one SSE line at a time
      if not raw.startswith(b"data: {"):
        continue
      obj = json.loads(raw[6:])
      if obj.get("usage"):
        tokens = obj["usage"]["completion_tokens"]
      elif (obj["choices"] and obj["choices"][0].get("token_ids")
            and first is None):
        first = time.perf_counter()
        if first_only:
          break
  done = time.perf_counter()
  return sent, (first or done) - sent, done - sent, tokens, done


def client_pool(smoke: bool):
  """The clients' executor: a spawned process (as vLLM's benchmark_serving
  runs apart from the server, so the clients' Python does not share the
  server's interpreter lock); with --smoke a thread of this process, which
  spares the smoke a second interpreter importing this script."""
  import concurrent.futures
  if smoke:
    return concurrent.futures.ThreadPoolExecutor(1)
  import multiprocessing
  return concurrent.futures.ProcessPoolExecutor(
      1, mp_context=multiprocessing.get_context("spawn"))


def load_in_child(pool, url, name, prompts, rate, seed, first_only=False):
  """load_run in the clients' executor `pool` (client_pool)."""
  return pool.submit(_load, url, name, prompts, rate, seed,
                     first_only).result()


def _load(url, name, prompts, rate, seed, first_only=False):
  try:
    return asyncio.run(load_run(url, name, prompts, rate, seed, first_only))
  except aiohttp.ClientError as e:  # aiohttp's errors do not pickle back
    raise RuntimeError(f"the load failed: {e!r}") from None


def ttft_alone(pool, url, name, prompts) -> list[float]:
  """Each prompt's TTFT alone on the idle server (a burst's own baseline:
  where the first token comes depends on the prompt)."""
  return [load_in_child(pool, url, name, [p], float("inf"), 0, True)[0][1]
          for p in prompts]


async def load_run(url, name, prompts, rate, seed, first_only=False):
  gaps = (np.zeros(len(prompts)) if rate == float("inf") else
          np.random.default_rng(seed).exponential(1 / rate, len(prompts)))
  starts = np.cumsum(gaps) - gaps[0]
  async with aiohttp.ClientSession(
      timeout=aiohttp.ClientTimeout(total=None),
      connector=aiohttp.TCPConnector(limit=0)) as client:
    t0 = time.perf_counter()
    return await asyncio.gather(*(one(client, url, name, p, s, t0,
                                      first_only)
                                  for p, s in zip(prompts, starts)))


def pct(xs, q):
  return float(np.percentile(xs, q))


def cpu_seconds(threads: dict) -> dict:
  """CPU seconds so far of this process and of each named thread."""
  out = {"process": time.process_time()}
  for name, t in threads.items():
    out[name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
  return out


def measure(pool, url, name, prompts, rate, offline_tps, alone_s,
            alone_ttft_s, alone_ttfts=None, threads=None) -> dict:
  """One load: throughput, TTFT and latency against a request alone, and
  the server's own counts over it (/metrics): device calls (host round
  trips) per generated token, requests loaded per call, the host's gap
  between calls, admission latency (the wait for a slot: queueing) and
  TTFT less it. alone_ttfts: each prompt's TTFT alone (ttft_alone), for
  TTFT against the same prompts alone; threads: {name: thread} whose CPU
  milliseconds per request (and the server process's) the row reports."""
  threads = threads or {}
  before, cpu0 = scrape(url), cpu_seconds(threads)
  res = load_in_child(pool, url, name, prompts, rate, 0)
  cpu1, after = cpu_seconds(threads), scrape(url)
  d = {k: after[k] - before.get(k, 0) for k in after}
  per = lambda a, b: d[a] / max(d[b], 1)
  span = max(r[4] for r in res) - min(r[0] for r in res)
  tokens = sum(r[3] for r in res)
  row = {
      "offered_rps": rate, "requests": len(res),
      "tokens_per_s": tokens / span,
      "ttft_p50_s": pct([r[1] for r in res], 50),
      "ttft_p99_s": pct([r[1] for r in res], 99),
      "latency_p50_s": pct([r[2] for r in res], 50),
      "latency_p99_s": pct([r[2] for r in res], 99),
      "round_trips_per_token": per("dllm_host_round_trips_total",
                                   "dllm_generated_tokens_total"),
      "decode_steps_per_round_trip": per("dllm_decode_steps_total",
                                         "dllm_host_round_trips_total"),
      "loaded_per_round_trip": per("dllm_admission_latency_seconds_count",
                                   "dllm_host_round_trips_total"),
      "host_gap_mean_s": per("dllm_host_gap_seconds_sum",
                             "dllm_host_gap_seconds_count"),
      "admission_latency_mean_s": per("dllm_admission_latency_seconds_sum",
                                      "dllm_admission_latency_seconds_count"),
      "cycle_mean_s": per("dllm_cycle_seconds_sum",
                          "dllm_cycle_seconds_count"),
      "fraction_of_offline": tokens / span / offline_tps,
      "server_cpu_ms_per_request": {
          k: 1e3 * (cpu1[k] - cpu0[k]) / len(res) for k in cpu0}}
  row["ttft_p50_vs_alone"] = row["ttft_p50_s"] / alone_ttft_s
  row["ttft_p50_less_queueing_vs_alone"] = max(
      row["ttft_p50_s"] - row["admission_latency_mean_s"], 0) / alone_ttft_s
  row["latency_p50_vs_alone"] = row["latency_p50_s"] / alone_s
  if alone_ttfts is not None:
    row["ttft_alone_same_prompts_p50_s"] = pct(alone_ttfts, 50)
    row["ttft_p50_vs_same_prompts_alone"] = (
        row["ttft_p50_s"] / row["ttft_alone_same_prompts_p50_s"])
    row["ttft_vs_alone_per_request_p50"] = pct(
        [r[1] / a for r, a in zip(res, alone_ttfts)], 50)
  return row
