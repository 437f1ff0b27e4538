"""Online serving under Poisson load against offline static batches.

Starts the OpenAI-compatible server in this process (so random LLaDA-8B
weights need no checkpoint on disk), measures offline `generate` over static
batches of --slots prompts (tokens/s of the second, compiled run), decodes one
request alone (the low-load latency floor), then sends --requests streaming
completions at each offered rate (Poisson arrivals; `inf`: all at once) and
reports throughput (completion tokens/s, and its fraction of the offline
figure), time to first token and request latency p50/p99 (and their ratios
to a request alone), host round trips per generated token and admission
latency (from the server's /metrics). With --cold-start it also times the
server's start (its engines compiled, nothing served yet) in two fresh
processes sharing an empty persistent compilation cache: the first compiles
everything, the second loads it. Writes one JSON file to --out and the
offered load vs tokens/s and latency plot beside it (.png).

  python scripts/bench_serve.py --smoke --out /tmp/serve_smoke.json
  python scripts/bench_serve.py --model llada-8b --slots 32 --gen-length 256 \\
      --requests 64 --rates 0.25,1,2,4,inf --cold-start --out serve_8b.json
  python scripts/bench_serve.py --model llada2-flash --mesh model=4 \\
      --strategy llada2 --slots 32 --gen-length 256 --rates inf \\
      --out serve_flash.json   # 4 GPUs: random weights on their shards

--mesh serves and decodes offline on one mesh (`serve --mesh`'s): the
weights are placed on it (llada2-flash's are built there), the slots split
over its data axis.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import uvicorn  # noqa: E402

import flash_dllm_jax  # noqa: E402
from flash_dllm_jax.cli import DEFAULT_CHECKPOINT  # noqa: E402
from flash_dllm_jax.generate import answer_ids  # noqa: E402
from flash_dllm_jax.serve.app import build_app  # noqa: E402
from flash_dllm_jax.serve.service import (Service, Settings,  # noqa: E402
                                          freeze_heap)
from flash_dllm_jax.strategies import build_sampler  # noqa: E402
from flash_dllm_bench import timing  # noqa: E402
from flash_dllm_bench.serve_load import (client_pool, load_in_child,  # noqa
                                         measure, pct, ttft_alone)


def model_and_prompts(args, mesh=None):
  """((params, config, tokenizer), prompts as token-id lists); the weights
  on `mesh`'s shards."""
  rng = np.random.default_rng(0)
  if args.model in ("llada-8b", "llada2-flash"):
    from flash_dllm_jax.config import ModelConfig
    config = ModelConfig.preset(args.model)
    params = timing.bench_params(config, mesh=mesh)
    prompts = [[int(t) for t in rng.integers(0, config.mask_token_id - 1,
                                             args.prompt_len)]
               for _ in range(args.requests)]
    return (params, config, None), prompts
  model = flash_dllm_jax.load(args.checkpoint)
  if mesh is not None:
    from flash_dllm_jax import parallel
    parallel.check_config(model[1], mesh)
    model = (parallel.shard_params(mesh, model[1], model[0]), *model[1:])
  tok = model[2]
  rows = [json.loads(line) for line in (
      ROOT / "data" / "synthetic_gsm" / "test.jsonl").read_text().splitlines()]
  prompts = [tok.encode(tok.apply_chat_template(
      [{"role": "user", "content": r["question"]}])) for r in rows]
  prompts = [p for p in prompts if len(p) <= args.max_prompt_tokens]
  if not prompts:
    raise SystemExit(f"no held-out problem's prompt fits --max-prompt-tokens "
                     f"{args.max_prompt_tokens} with {args.checkpoint}'s "
                     "tokenizer")
  return model, [prompts[i % len(prompts)] for i in range(args.requests)]


def offline_tokens_per_s(model, sampler, prompts, slots, stop_at_eos,
                         mesh=None, runs=2):
  """Static batches of `slots` prompts through `generate` (on `mesh`);
  the last of `runs` runs (the second: compiled)."""
  config = model[1]
  for _ in range(runs):
    tokens, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), slots):
      out = flash_dllm_jax.generate(model, prompts[i:i + slots],
                                    sampler=sampler, stop_at_eos=stop_at_eos,
                                    mesh=mesh)
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


# bounded, so that every answer closes within the canvas: an unbounded
# integer lets a model that never wrote JSON emit digits to the end
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {
    "type": "integer", "minimum": 0, "maximum": 999999}},
    "required": ["answer"], "additionalProperties": False}


def json_schema_cost(url, name, service, prompts) -> dict:
  """Each prompt alone, plainly and under ANSWER_SCHEMA (serve/structured.py):
  latency p50 and its ratio, tokens per decoding step, the host's grammar
  milliseconds per step, and the fraction of answers that parse."""
  plain, shaped, valid, counts = [], [], 0, {"plain": [0, 0], "json": [0, 0]}
  fmt = {"type": "json_schema", "json_schema": {"name": "answer",
                                                 "schema": ANSWER_SCHEMA}}
  for p in prompts:
    for kind, extra, times in (("plain", {}, plain),
                               ("json", {"response_format": fmt}, shaped)):
      t0 = time.perf_counter()
      r = httpx.post(url + "/v1/completions", timeout=None,
                     json={"model": name, "prompt": p, **extra})
      times.append(time.perf_counter() - t0)
      r.raise_for_status()
      usage = r.json()["usage"]
      counts[kind][0] += usage["completion_tokens"]
      counts[kind][1] += usage["decode_steps"]
      if kind == "json":
        try:
          json.loads(r.json()["choices"][0]["text"])
          valid += 1
        except ValueError:
          pass
  st = service.structured(0)
  return {"requests": len(prompts),
          "plain_latency_p50_s": pct(plain, 50),
          "json_latency_p50_s": pct(shaped, 50),
          "json_vs_plain_latency": pct(shaped, 50) / pct(plain, 50),
          "plain_tokens_per_step": counts["plain"][0] / max(
              counts["plain"][1], 1),
          "json_tokens_per_step": counts["json"][0] / max(
              counts["json"][1], 1),
          "host_ms_per_step": 1e3 * st.host_s / max(st.steps, 1),
          "valid_json_fraction": valid / len(prompts)}


def compile_only(args) -> dict:
  """Builds the model and the server's engines in this process (the
  persistent cache in --cache-dir) and returns the seconds each took."""
  from flash_dllm_jax.compilation import enable_persistent_cache
  t0 = time.perf_counter()
  enable_persistent_cache(args.cache_dir)
  from flash_dllm_jax import parallel
  mesh = parallel.parse_mesh(args.mesh)
  model, prompts = model_and_prompts(args, mesh)
  sampler, settings, _ = server_settings(args, model, prompts)
  t1 = time.perf_counter()
  service = Service(*model, sampler, settings, mesh=mesh)
  t2 = time.perf_counter()
  service.engine_core.stop()
  return {"model_s": t1 - t0, "compile_s": t2 - t1, "total_s": t2 - t0}


def cold_start(argv, cache: str) -> dict:
  """compile_only in two fresh processes sharing the empty cache directory
  `cache`: 'cold' compiles, 'warm' loads the first's executables."""
  out = {}
  for name in ("cold", "warm"):
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, __file__, *argv, "--compile-only",
                          "--cache-dir", cache], capture_output=True,
                         text=True, check=False)
    if run.returncode:
      raise RuntimeError(f"--compile-only failed:\n{run.stderr[-3000:]}")
    out[name] = {**json.loads(run.stdout.strip().splitlines()[-1]),
                 "process_s": time.perf_counter() - t0}
  return out


def plot(rows, alone_s, path: Path) -> None:
  """Offered load vs tokens/s (left) and latency p50 / p99 (right); `inf`
  (everything at once) drawn past the largest finite load."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  finite = [r["offered_rps"] for r in rows if r["offered_rps"] != float("inf")]
  top = 2 * max(finite) if finite else 1.0
  xs = [r["offered_rps"] if r["offered_rps"] != float("inf") else top
        for r in rows]
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
  a.plot(xs, [r["tokens_per_s"] for r in rows], "o-")
  a.set(xlabel="offered load, requests/s (last point: all at once)",
        ylabel="completion tokens/s", xscale="log")
  for key, style in (("latency_p50_s", "o-"), ("latency_p99_s", "s--"),
                     ("ttft_p50_s", "^:")):
    b.plot(xs, [r[key] for r in rows], style, label=key[:-2])
  b.axhline(alone_s, color="gray", lw=0.8, label="a request alone")
  b.set(xlabel="offered load, requests/s (last point: all at once)",
        ylabel="seconds", xscale="log", yscale="log")
  b.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def server_settings(args, model, prompts):
  """(sampler, Settings, stop_at_eos) the benchmark serves with."""
  options = {"gen_length": args.gen_length}
  stop_at_eos = True
  if args.model == "llada-8b":  # the fixed rule: steps independent of weights
    options.update(rule="fixed", steps=args.gen_length // 2)
    stop_at_eos = False
  if args.model == "llada2-flash":  # random weights: every position decoded
    stop_at_eos = False
    if args.strategy == "llada2":  # the pure schedule, 16 tokens a step
      options.update(threshold=None, steps=2)
  sampler = build_sampler(args.strategy, model[1].arch, options)
  settings = Settings(model_name=args.model, strategy=args.strategy,
                      slots=args.slots,
                      max_prompt_tokens=max(len(p) for p in prompts),
                      steps_per_call=args.steps_per_call,
                      steps_while_admitting=args.steps_while_admitting,
                      max_queue=max(256, args.requests),
                      max_logprobs=0,  # no top-logprobs program to compile
                      stop_at_eos=stop_at_eos)
  return sampler, settings, stop_at_eos


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", choices=["shipped", "llada-8b", "llada2-flash"],
                  default="shipped", help="the shipped checkpoint or random "
                  "weights at a preset's shapes")
  ap.add_argument("--mesh", default=None,
                  help="serve and decode offline on this mesh, e.g. "
                  "'model=4' or 'data=2,model=4'")
  ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
  ap.add_argument("--strategy", default="flash-dllm")
  ap.add_argument("--slots", type=int, default=8)
  ap.add_argument("--gen-length", type=int, default=64)
  ap.add_argument("--prompt-len", type=int, default=64,
                  help="llada-8b: random prompt length")
  ap.add_argument("--max-prompt-tokens", type=int, default=128)
  ap.add_argument("--steps-per-call", type=int, default=8)
  ap.add_argument("--steps-while-admitting", type=int, default=2)
  ap.add_argument("--requests", type=int, default=64)
  ap.add_argument("--rates", default="1,4,inf",
                  help="offered loads, requests/s, comma-separated")
  ap.add_argument("--smoke", action="store_true",
                  help="checks the script runs: the shipped model at tiny "
                  "sizes, one offline run (it compiles), one request alone, "
                  "the clients in a thread of this process, and with "
                  "--cold-start the server's programs loaded from its cache")
  ap.add_argument("--cold-start", action="store_true",
                  help="also time the server's start, compiling and with a "
                       "warm persistent compilation cache (two processes)")
  ap.add_argument("--compile-only", action="store_true",
                  help=argparse.SUPPRESS)  # one --cold-start process
  ap.add_argument("--cache-dir", type=Path, default=None,
                  help=argparse.SUPPRESS)
  ap.add_argument("--json-schema", type=int, default=0, metavar="N",
                  help="also decode N prompts alone plainly and under a JSON "
                       "schema (a checkpoint with a tokenizer)")
  ap.add_argument("--out", type=Path, default=None)
  args = ap.parse_args(argv)
  if args.out is None and not args.compile_only:
    ap.error("--out is required")
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
  if args.smoke:
    args.model, args.slots, args.gen_length, args.requests = ("shipped", 4,
                                                             16, 8)
    args.max_prompt_tokens, args.rates = 64, "8,inf"
  if args.compile_only:
    print(json.dumps(compile_only(args)))
    return
  with tempfile.TemporaryDirectory(prefix="serve-cache-") as cache:
    bench(args, argv, cache)


def bench(args, argv, cache: str) -> None:
  """The benchmark; `cache`: an empty directory for --cold-start's
  processes."""
  rates = [float(r) for r in args.rates.split(",")]
  starts = None
  if args.cold_start:  # first: the processes have the device to themselves
    argv_out = [a for a in (sys.argv[1:] if argv is None else argv)
                if a != "--cold-start"]
    starts = cold_start(argv_out, cache)
    print(f"cold start {starts['cold']['total_s']:.1f} s (compile "
          f"{starts['cold']['compile_s']:.1f} s); warm cache "
          f"{starts['warm']['total_s']:.1f} s (compile "
          f"{starts['warm']['compile_s']:.1f} s)")
    if args.smoke:  # the server's programs load from the cold start's cache
      from flash_dllm_jax.compilation import enable_persistent_cache
      enable_persistent_cache(cache)
  from flash_dllm_jax import parallel
  mesh = parallel.parse_mesh(args.mesh)
  model, prompts = model_and_prompts(args, mesh)
  params, config, tok = model
  sampler, settings, stop_at_eos = server_settings(args, model, prompts)
  offline = offline_tokens_per_s(model, sampler, prompts, args.slots,
                                 stop_at_eos, mesh, 1 if args.smoke else 2)
  print(f"offline static batches of {args.slots}: {offline[0]:.1f} tokens/s")
  t0 = time.perf_counter()
  service = Service(params, config, tok, sampler, settings, mesh=mesh)
  compile_s = time.perf_counter() - t0
  freeze_heap()  # as `serve` does once compiled
  server, thread, url = start_server(service, args.model)
  pool = client_pool(args.smoke)
  alone_runs = [load_in_child(pool, url, args.model, prompts[:1],
                              float("inf"), 0)[0]
                for _ in range(1 if args.smoke else 3)]
  alone = float(np.median([r[2] for r in alone_runs]))
  alone_ttft = float(np.median([r[1] for r in alone_runs]))
  threads = {"http": thread, "engine": service.engine_core.thread}
  rows = [measure(pool, url, args.model, prompts, rate, offline[0], alone,
                  alone_ttft, threads=threads) for rate in rates]
  # a burst that fits the slots: TTFT with no queueing beyond them, against
  # the same prompts alone
  burst = prompts[:args.slots]
  fits = measure(pool, url, args.model, burst, float("inf"), offline[0],
                 alone, alone_ttft, ttft_alone(pool, url, args.model, burst),
                 threads)
  pool.shutdown()
  schema_row = None
  if args.json_schema and importlib.util.find_spec("llguidance") is None:
    print("--json-schema: skipped (llguidance is not installed)")
  elif args.json_schema and tok is not None:
    schema_row = json_schema_cost(url, args.model, service,
                                  prompts[:args.json_schema])
  elif args.json_schema:
    print("--json-schema: skipped (this model has no tokenizer)")
  server.should_exit = True
  thread.join(30)
  service.engine_core.stop()
  result = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "command": " ".join(sys.argv), "device": jax.devices()[0].device_kind,
      "jax": jax.__version__, "model": args.model, "strategy": args.strategy,
      "mesh": args.mesh,
      "sampler": repr(sampler), "slots": args.slots,
      "prompt_len": settings.prompt_len,
      "steps_per_call": args.steps_per_call,
      "offline_tokens_per_s": offline[0], "offline_tokens": offline[1],
      "alone_latency_s": alone, "alone_ttft_s": alone_ttft,
      "compile_s": compile_s, "cold_start": starts, "loads": rows,
      "peak_gb": None if (peak := timing.peak_memory_bytes()) is None
      else peak / 1e9,  # the device's, over the whole run (None: no stats)
      "burst_fitting_slots": fits,
      "steps_while_admitting": args.steps_while_admitting,
      "json_schema": schema_row}
  args.out.write_text(json.dumps(result, indent=2))
  plot(rows, result["alone_latency_s"], args.out.with_suffix(".png"))
  print(f"device {result['device']}, {args.model}, {args.strategy}, "
        f"{args.slots} slots, gen {args.gen_length}; offline "
        f"{offline[0]:.1f} tok/s; alone {result['alone_latency_s']:.3f} s "
        f"(TTFT {alone_ttft:.3f} s); peak "
        + ("-" if result["peak_gb"] is None else f"{result['peak_gb']:.2f} GB"))
  head = ("load rps", "tok/s", "x offline", "TTFT p50", "xTTFT 1",
          "xTTFT-q", "TTFT p99", "lat p50", "xlat 1", "lat p99", "trips/tok",
          "load/trip", "gap ms", "admit ms", "cpu ms/rq", "http ms", "eng ms")
  print(" | ".join(f"{h:>9}" for h in head))
  for r in rows + [fits]:
    print(" | ".join(f"{v:>9}" for v in (
        f"{r['offered_rps']:g}" if r is not fits else f"{r['requests']} once",
        f"{r['tokens_per_s']:.1f}",
        f"{r['fraction_of_offline']:.3f}", f"{r['ttft_p50_s']:.3f}",
        f"{r['ttft_p50_vs_alone']:.2f}",
        f"{r['ttft_p50_less_queueing_vs_alone']:.2f}",
        f"{r['ttft_p99_s']:.3f}",
        f"{r['latency_p50_s']:.3f}", f"{r['latency_p50_vs_alone']:.3f}",
        f"{r['latency_p99_s']:.3f}", f"{r['round_trips_per_token']:.4f}",
        f"{r['loaded_per_round_trip']:.2f}",
        f"{1e3 * r['host_gap_mean_s']:.2f}",
        f"{1e3 * r['admission_latency_mean_s']:.1f}",
        *(f"{r['server_cpu_ms_per_request'][k]:.2f}"
          for k in ("process", "http", "engine")))))
  sat = [r for r in rows if r["offered_rps"] == float("inf")]
  low = [r for r in rows if r["offered_rps"] != float("inf")]
  print("targets: saturation " + (f"{sat[-1]['fraction_of_offline']:.3f}"
        if sat else "-") + " of offline; latency p50 at the lowest load "
        + (f"{low[0]['latency_p50_vs_alone']:.3f}" if low else "-")
        + "x alone; TTFT p50 of a burst of " + f"{fits['requests']} "
        f"(fits the slots) {fits['ttft_p50_vs_same_prompts_alone']:.2f}x "
        f"the same prompts alone (p50 {fits['ttft_alone_same_prompts_p50_s']:.3f}"
        f" s; per request {fits['ttft_vs_alone_per_request_p50']:.2f}x; "
        f"{fits['ttft_p50_vs_alone']:.2f}x the first prompt alone)" + (
            f", at saturation {sat[-1]['ttft_p50_vs_alone']:.2f}x (queueing "
            f"{sat[-1]['admission_latency_mean_s']:.3f} s mean; without it "
            f"{sat[-1]['ttft_p50_less_queueing_vs_alone']:.2f}x)"
            if sat else ""))
  if schema_row:
    print(f"JSON schema, {schema_row['requests']} requests alone: latency "
          f"p50 {schema_row['json_latency_p50_s']:.3f} s vs plain "
          f"{schema_row['plain_latency_p50_s']:.3f} s "
          f"({schema_row['json_vs_plain_latency']:.2f}x); tokens/step "
          f"{schema_row['json_tokens_per_step']:.2f} vs plain "
          f"{schema_row['plain_tokens_per_step']:.2f}; host "
          f"{schema_row['host_ms_per_step']:.2f} ms/step; valid JSON "
          f"{schema_row['valid_json_fraction']:.2f}")
  print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
  main()
