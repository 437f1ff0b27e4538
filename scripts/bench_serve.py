"""Online serving under Poisson load against offline static batches.

Starts the OpenAI-compatible server in this process (so random LLaDA-8B
weights need no checkpoint on disk), measures offline `generate` over static
batches of --slots prompts (tokens/s of the second, compiled run), decodes one
request alone (the low-load latency floor), then sends --requests streaming
completions at each offered rate (Poisson arrivals; `inf`: all at once) and
reports throughput (completion tokens/s), time to first token and request
latency p50/p99, host round trips per generated token and admission latency
(from the server's /metrics). Writes one JSON file to --out.

  python scripts/bench_serve.py --smoke --out /tmp/serve_smoke.json
  python scripts/bench_serve.py --model llada-8b --slots 32 --gen-length 256 \\
      --requests 256 --rates 1 2 4 8 inf --out serve_8b.json   # GPU
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import uvicorn  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa

import flash_dllm_jax  # noqa: E402
from flash_dllm_jax.cli import DEFAULT_CHECKPOINT  # noqa: E402
from flash_dllm_jax.generate import answer_ids  # noqa: E402
from flash_dllm_jax.serve.app import build_app  # noqa: E402
from flash_dllm_jax.serve.service import Service, Settings  # noqa: E402
from flash_dllm_jax.strategies import build_sampler  # noqa: E402


def model_and_prompts(args):
  """((params, config, tokenizer), prompts as token-id lists)."""
  rng = np.random.default_rng(0)
  if args.model == "llada-8b":
    from flash_dllm_bench import timing
    from flash_dllm_jax.config import ModelConfig
    config = ModelConfig.preset("llada-8b")
    params = timing.bench_params(config)
    prompts = [[int(t) for t in rng.integers(0, config.mask_token_id - 1,
                                             args.prompt_len)]
               for _ in range(args.requests)]
    return (params, config, None), prompts
  model = flash_dllm_jax.load(args.checkpoint)
  tok = model[2]
  rows = [json.loads(line) for line in (
      ROOT / "data" / "synthetic_gsm" / "test.jsonl").read_text().splitlines()]
  prompts = [tok.encode(tok.apply_chat_template(
      [{"role": "user", "content": r["question"]}])) for r in rows]
  prompts = [p for p in prompts if len(p) <= args.max_prompt_tokens]
  return model, [prompts[i % len(prompts)] for i in range(args.requests)]


def offline_tokens_per_s(model, sampler, prompts, slots, stop_at_eos):
  """Static batches of `slots` prompts through `generate`; second run."""
  config = model[1]
  for _ in range(2):
    tokens, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), slots):
      out = flash_dllm_jax.generate(model, prompts[i:i + slots],
                                    sampler=sampler, stop_at_eos=stop_at_eos)
      tokens += sum(len(answer_ids(g, config)) for g in out.tokens_BxG)
    seconds = time.perf_counter() - t0
  return tokens / seconds, tokens, seconds


def start_server(service, name):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  server = uvicorn.Server(uvicorn.Config(build_app(lambda: service, name),
                                         host="127.0.0.1", port=port,
                                         log_level="warning"))
  thread = threading.Thread(target=server.run, daemon=True)
  thread.start()
  url = f"http://127.0.0.1:{port}"
  for _ in range(600):
    try:
      if httpx.get(url + "/health").status_code == 200:
        return server, thread, url
    except httpx.TransportError:
      time.sleep(0.1)
  raise TimeoutError("server did not start")


def scrape(url) -> dict:
  text = httpx.get(url + "/metrics").text
  return {s.name: s.value for f in text_string_to_metric_families(text)
          for s in f.samples if not s.labels}


async def one(client, url, name, prompt, start_at, t0):
  await asyncio.sleep(max(0.0, start_at - (time.perf_counter() - t0)))
  sent, first, tokens = time.perf_counter(), None, 0
  body = {"model": name, "prompt": prompt, "stream": True}
  async with client.stream("POST", url + "/v1/completions", json=body) as r:
    r.raise_for_status()
    async for line in r.aiter_lines():
      if not line.startswith("data: {"):
        continue
      obj = json.loads(line[6:])
      if obj.get("usage"):
        tokens = obj["usage"]["completion_tokens"]
      elif (obj["choices"] and obj["choices"][0].get("token_ids")
            and first is None):
        first = time.perf_counter()
  done = time.perf_counter()
  return sent, (first or done) - sent, done - sent, tokens, done


async def load_run(url, name, prompts, rate, seed):
  gaps = (np.zeros(len(prompts)) if rate == float("inf") else
          np.random.default_rng(seed).exponential(1 / rate, len(prompts)))
  starts = np.cumsum(gaps) - gaps[0]
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  async with httpx.AsyncClient(timeout=None, limits=limits) as client:
    t0 = time.perf_counter()
    return await asyncio.gather(*(one(client, url, name, p, s, t0)
                                  for p, s in zip(prompts, starts)))


def pct(xs, q):
  return float(np.percentile(xs, q))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", choices=["shipped", "llada-8b"],
                  default="shipped")
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
  ap.add_argument("--strategy", default="flash-dllm")
  ap.add_argument("--slots", type=int, default=8)
  ap.add_argument("--gen-length", type=int, default=64)
  ap.add_argument("--prompt-len", type=int, default=64,
                  help="llada-8b: random prompt length")
  ap.add_argument("--max-prompt-tokens", type=int, default=128)
  ap.add_argument("--steps-per-call", type=int, default=8)
  ap.add_argument("--requests", type=int, default=64)
  ap.add_argument("--rates", default="1,4,inf",
                  help="offered loads, requests/s, comma-separated")
  ap.add_argument("--smoke", action="store_true",
                  help="shipped model, tiny sizes: checks the script runs")
  ap.add_argument("--out", type=Path, required=True)
  args = ap.parse_args(argv)
  if args.smoke:
    args.model, args.slots, args.gen_length, args.requests = ("shipped", 4,
                                                             16, 12)
    args.max_prompt_tokens, args.rates = 64, "8,inf"
  rates = [float(r) for r in args.rates.split(",")]
  options = {"gen_length": args.gen_length}
  stop_at_eos = True
  if args.model == "llada-8b":  # the fixed rule: steps independent of weights
    options.update(rule="fixed", steps=args.gen_length // 2)
    stop_at_eos = False
  model, prompts = model_and_prompts(args)
  params, config, tok = model
  sampler = build_sampler(args.strategy, config.arch, options)
  bucket = max(-(-len(p) // 32) * 32 for p in prompts)
  offline = offline_tokens_per_s(model, sampler, prompts, args.slots,
                                 stop_at_eos)
  print(f"offline static batches of {args.slots}: {offline[0]:.1f} tokens/s")
  settings = Settings(model_name=args.model, strategy=args.strategy,
                      slots=args.slots, max_prompt_tokens=bucket,
                      steps_per_call=args.steps_per_call,
                      max_queue=max(256, args.requests),
                      stop_at_eos=stop_at_eos)
  service = Service(params, config, tok, sampler, settings)
  server, thread, url = start_server(service, args.model)
  alone = [asyncio.run(load_run(url, args.model, prompts[:1], float("inf"),
                                0))[0][2] for _ in range(3)]
  rows = []
  for rate in rates:
    before = scrape(url)
    res = asyncio.run(load_run(url, args.model, prompts, rate, 0))
    after = scrape(url)
    d = {k: after[k] - before.get(k, 0) for k in after}
    span = max(r[4] for r in res) - min(r[0] for r in res)
    tokens = sum(r[3] for r in res)
    rows.append({
        "offered_rps": rate, "requests": len(res),
        "tokens_per_s": tokens / span,
        "ttft_p50_s": pct([r[1] for r in res], 50),
        "ttft_p99_s": pct([r[1] for r in res], 99),
        "latency_p50_s": pct([r[2] for r in res], 50),
        "latency_p99_s": pct([r[2] for r in res], 99),
        "round_trips_per_token": d["dllm_host_round_trips_total"] / max(
            d["dllm_generated_tokens_total"], 1),
        "decode_steps_per_round_trip": d["dllm_decode_steps_total"] / max(
            d["dllm_host_round_trips_total"], 1),
        "admission_latency_mean_s": d["dllm_admission_latency_seconds_sum"]
        / max(d["dllm_admission_latency_seconds_count"], 1),
        "cycle_mean_s": d["dllm_cycle_seconds_sum"]
        / max(d["dllm_cycle_seconds_count"], 1),
        "fraction_of_offline": tokens / span / offline[0]})
  server.should_exit = True
  thread.join(30)
  service.scheduler.stop()
  result = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "command": " ".join(sys.argv), "device": jax.devices()[0].device_kind,
      "jax": jax.__version__, "model": args.model, "strategy": args.strategy,
      "sampler": repr(sampler), "slots": args.slots,
      "prompt_buckets": list(settings.buckets),
      "steps_per_call": args.steps_per_call,
      "offline_tokens_per_s": offline[0], "offline_tokens": offline[1],
      "alone_latency_s": float(np.median(alone)), "loads": rows}
  args.out.write_text(json.dumps(result, indent=2))
  print(f"device {result['device']}, {args.model}, {args.strategy}, "
        f"{args.slots} slots, gen {args.gen_length}; offline "
        f"{offline[0]:.1f} tok/s; alone {result['alone_latency_s']:.3f} s")
  head = ("load rps", "tok/s", "x offline", "TTFT p50", "TTFT p99",
          "lat p50", "lat p99", "trips/tok", "admit ms")
  print(" | ".join(f"{h:>9}" for h in head))
  for r in rows:
    print(" | ".join(f"{v:>9}" for v in (
        f"{r['offered_rps']:g}", f"{r['tokens_per_s']:.1f}",
        f"{r['fraction_of_offline']:.2f}", f"{r['ttft_p50_s']:.3f}",
        f"{r['ttft_p99_s']:.3f}", f"{r['latency_p50_s']:.3f}",
        f"{r['latency_p99_s']:.3f}", f"{r['round_trips_per_token']:.3f}",
        f"{1e3 * r['admission_latency_mean_s']:.1f}")))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
