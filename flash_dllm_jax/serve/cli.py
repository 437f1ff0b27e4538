"""`python -m flash_dllm_jax serve`: the OpenAI-compatible server.

Sampler flags come from the strategy registry (every option some strategy
takes); the chosen strategy rejects the ones it does not take.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
import threading

from flash_dllm_jax import parallel, quantize
from flash_dllm_jax.checkpoint import load
from flash_dllm_jax.cli_flags import (add_checkpoint_flag,
                                      add_compile_cache_flags,
                                      check_checkpoint, default_checkpoint,
                                      start_compile_cache)
from flash_dllm_jax.ops import choice
from flash_dllm_jax.sampling.loop import tail_length
from flash_dllm_jax.serve import MAX_BODY_BYTES, MAX_LOGPROBS, memory_plan
from flash_dllm_jax.serve.memory_plan import DEFAULT_UTILIZATION
from flash_dllm_jax.serve.cli_variants import build_variants, default_strategy
from flash_dllm_jax.strategies import STRATEGIES, build
from flash_dllm_jax.strategy_flags import add_option_flags, options_from_args

log = logging.getLogger("flash_dllm_jax.serve")

# Seconds between failing what is left at --shutdown-timeout and uvicorn
# cancelling the handlers that still have not answered.
_SHUTDOWN_GRACE = 10.0


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
  """Each flag's help ends with its default, where it has a value (None:
  the strategy's or checkpoint's own)."""

  def _get_help_string(self, action):
    if action.default in (None, False, []) or action.help is None:
      return action.help
    return super()._get_help_string(action)


def add_parser(sub) -> None:
  """Registers the `serve` subcommand on an argparse subparsers object."""
  ap = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API",
                      formatter_class=_ShowDefaults)
  ap.set_defaults(main=main)
  add_checkpoint_flag(ap)
  ap.add_argument("--strategy", default=None, choices=sorted(STRATEGIES),
                  help="decoding strategy (default: flash-dllm where it "
                       "decodes the checkpoint's family, else the family's "
                       "own, as generate picks it)")
  # -- memory plan (serve/memory_plan.py) --
  ap.add_argument("--batch-size", type=int, default=None,
                  help="device slots, shared by every prompt length "
                       "(default: as many as --gpu-memory-utilization fits)")
  ap.add_argument("--max-prompt-tokens", type=int, default=None,
                  help="longest prompt served (slots hold it rounded up to "
                       "a multiple of 64; default: the model's context less "
                       "the generation)")
  ap.add_argument("--gpu-memory-utilization", type=float,
                  default=DEFAULT_UTILIZATION,
                  help="fraction of the device's memory the server uses "
                       "(weights, workspace, slots; default: %(default)s)")
  # -- end memory plan --
  ap.add_argument("--steps-per-call", type=int, default=8,
                  help="decoding steps the compiled loop runs at most before "
                       "returning to the host; it refills slots from its "
                       "queue of waiting requests as rows finish, and "
                       "returns early when a finished row has nothing to "
                       "refill it (default: %(default)s)")
  ap.add_argument("--steps-while-admitting", type=int, default=2,
                  help="the step limit of a call while none waits beyond "
                       "its queue and a slot is free at its start, or none "
                       "is queued and a decoding request has sent nothing "
                       "yet: an arrival waits at most this many steps for a "
                       "free slot, and a new request streams its first "
                       "tokens that soon; capped by the steps per call "
                       "(default: %(default)s)")
  ap.add_argument("--max-logprobs", type=int, default=MAX_LOGPROBS,
                  help="most alternatives per token a request may ask for "
                       "(top_logprobs; completions' logprobs); a strategy "
                       "that records them compiles that program at start "
                       "(0: none)")
  ap.add_argument("--max-queue", type=int, default=256,
                  help="waiting requests before 429")
  ap.add_argument("--request-timeout", type=float, default=600.0,
                  help="default per-request deadline, seconds")
  ap.add_argument("--served-model-name", default=None,
                  help="the `model` clients send (default: the checkpoint "
                       "directory's name)")
  ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=None)
  quantize.add_flags(ap)
  ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
  ap.add_argument("--port", type=int, default=8000, help="port to listen on")
  ap.add_argument("--variant", action="append", default=[],
                  metavar="KEY=VALUE[,KEY=VALUE...]",
                  help="a further sampler variant, compiled at start: the "
                       "server's sampler options with these changed "
                       "(repeatable; options that change the compiled "
                       "program); a request picks one by stating equal "
                       "`decoding` options")
  choice.add_flags(ap)
  ap.add_argument("--mesh", default=None,
                  help="'data=D', 'model=M' or 'data=D,model=M': split the "
                       "slots over D devices and the weights over M")
  ap.add_argument("--shutdown-timeout", type=float, default=30.0,
                  help="on SIGTERM, seconds to let in-flight requests finish "
                       "(the rest get 503)")
  ap.add_argument("--api-key", default=None,
                  help="the Bearer token every /v1 route requires (default: "
                       "$FLASH_DLLM_JAX_API_KEY; unset: none)")
  ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                  help="larger request bodies get 413 (default: %(default)s)")
  ap.add_argument("--header-timeout", type=float, default=10.0,
                  help="seconds a connection may take to send a request's "
                       "headers before it is closed (default: %(default)s)")
  add_compile_cache_flags(ap)
  add_option_flags(ap, "sampler options")


def main(args: argparse.Namespace) -> int:
  # The serve extra (fastapi, uvicorn, prometheus-client): imported only
  # when serving, so the other commands run without it.
  import uvicorn

  from flash_dllm_jax.serve.app import build_app
  from flash_dllm_jax.serve.security import (API_KEY_ENV,
                                             header_timeout_protocol,
                                             is_loopback)
  from flash_dllm_jax.serve.service import (Service, Settings, check_pool,
                                            freeze_heap)

  handler = logging.StreamHandler()
  handler.setFormatter(logging.Formatter(
      "%(asctime)s %(levelname)s %(name)s: %(message)s"))
  log.addHandler(handler)
  log.setLevel(logging.INFO)
  log.propagate = False
  options = options_from_args(args)
  checkpoint = args.checkpoint or default_checkpoint()
  name = args.served_model_name or checkpoint.resolve().name
  api_key = args.api_key if args.api_key is not None else os.environ.get(
      API_KEY_ENV)
  try:
    check_checkpoint(checkpoint, args.checkpoint is not None)
    if api_key is not None and not api_key.strip():
      raise ValueError(f"the API key (--api-key or ${API_KEY_ENV}) is empty")
    if not 0 <= args.port <= 65535:
      raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_body_bytes < 1:
      raise ValueError(f"--max-body-bytes must be >= 1, got "
                       f"{args.max_body_bytes}")
    for flag, low in (("request_timeout", 0), ("header_timeout", 0),
                      ("shutdown_timeout", None)):
      value = getattr(args, flag)  # NaN passes no range check: finite first
      if not math.isfinite(value) or (value <= low if low is not None
                                      else value < 0):
        raise ValueError(f"--{flag.replace('_', '-')} must be a finite "
                         f"number {'> 0' if low is not None else '>= 0'}, "
                         f"got {value}")
    # -- memory plan: the allocator gets the utilization's share before
    # the backend starts (the user's own XLA_PYTHON_CLIENT_MEM_FRACTION wins)
    memory_plan.check_utilization(args.gpu_memory_utilization)
    os.environ.setdefault(memory_plan.MEM_FRACTION_ENV,
                          str(args.gpu_memory_utilization))
    # -- end memory plan --
    start_compile_cache(args)
    params, config, tokenizer = load(checkpoint, dtype=args.dtype,
                                     quantize=args.quantize,
                                     quantize_head=args.quantize_head,
                                     quantize_embedding=(
                                         args.quantize_embedding))
    strategy = args.strategy or default_strategy(config.arch)
    # --temperature/--top-p/--top-k of a strategy that samples per row: the
    # defaults of requests that do not set them
    sampler, row_defaults = build(strategy, config.arch, options)
    variants = build_variants(strategy, config.arch, options, sampler,
                              args.variant)
    mesh = parallel.parse_mesh(args.mesh)
    if mesh is not None:
      parallel.check_config(config, mesh)
      if args.batch_size is not None and args.batch_size % parallel.data_size(
          mesh):
        raise ValueError(f"--batch-size {args.batch_size} must be a multiple "
                         f"of the mesh's data size "
                         f"{parallel.data_size(mesh)}")
      params = parallel.shard_params(mesh, config, params)
    # -- memory plan: slots and prompt capacity from the budget --
    slot_plan = memory_plan.plan_slots(
        config, sampler, weight_bytes=quantize.weight_bytes(params),
        budget_bytes=memory_plan.allocator_bytes(), slots=args.batch_size,
        max_prompt_tokens=args.max_prompt_tokens,
        tail=max(tail_length(s) for s in (sampler, *variants)),
        data_devices=1 if mesh is None else parallel.data_size(mesh))
    # -- end memory plan --
    settings = Settings(model_name=name, strategy=strategy,
                        slots=slot_plan.slots,
                        max_prompt_tokens=slot_plan.max_prompt_tokens,
                        steps_per_call=args.steps_per_call,
                        steps_while_admitting=args.steps_while_admitting,
                        max_queue=args.max_queue,
                        request_timeout=args.request_timeout,
                        kernels=choice.kernels_from_args(args),
                        slot_plan=slot_plan.as_dict(),
                        sampling=row_defaults,
                        max_logprobs=args.max_logprobs)
    for v in (sampler, *variants):  # the slot plan fits, before the port
      check_pool(settings, v, config)
  except (ValueError, FileNotFoundError, TypeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  log.info("settings: checkpoint=%s model=%s arch=%s strategy=%s sampler=%r "
           "variants=%r mesh=%s %s", checkpoint, name, config.arch,
           strategy, sampler, variants, args.mesh, settings)
  if api_key is None and not is_loopback(args.host):
    log.warning("listening on %s without an API key: anyone who reaches it "
                "can use it (set --api-key or $%s)", args.host, API_KEY_ENV)
  holder: dict = {}

  def engine_lost():  # the engine failed for good: stop, exit status 1
    holder["failed"] = True
    server.should_exit = True

  def compile_engines():
    try:
      service = Service(params, config, tokenizer, sampler, settings,
                        variants, mesh, engine_lost)
      freeze_heap()
      holder["service"] = service
      log.info("ready: %s batching, %d slots of %d prompt positions (%s)",
               holder["service"].mode, settings.slots, settings.prompt_len,
               settings.slot_plan["reason"])
    except Exception:  # noqa: BLE001 - logged, and the server exits
      log.exception("compiling the engines failed")
      holder["failed"] = True
      server.should_exit = True

  app = build_app(lambda: holder.get("service"), name, api_key,
                  args.max_body_bytes)

  class Server(uvicorn.Server):
    def handle_exit(self, sig, frame):  # SIGTERM / SIGINT: stop admitting
      if "service" in holder:
        holder["service"].engine_core.drain()
      super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None):
      """Past --shutdown-timeout the engine core fails what is left (503
      `server_shutdown`, answered by the handlers); uvicorn's own deadline,
      a little later, is the backstop."""
      async def fail_the_rest():
        await asyncio.sleep(args.shutdown_timeout)
        if "service" in holder:
          await asyncio.to_thread(holder["service"].engine_core.stop)

      task = asyncio.ensure_future(fail_the_rest())
      try:
        await super().shutdown(sockets)
      finally:
        task.cancel()

  server = Server(uvicorn.Config(
      app, host=args.host, port=args.port, log_level="info",
      http=header_timeout_protocol(args.header_timeout),
      timeout_graceful_shutdown=args.shutdown_timeout + _SHUTDOWN_GRACE))
  threading.Thread(target=compile_engines, name="dllm-compile",
                   daemon=True).start()
  # uvicorn re-raises the signal it shut down for once it has restored the
  # handlers it found: make those no-ops, so the engine core stops cleanly
  # below and the exit status is ours.
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: None)
  server.run()
  if "service" in holder:
    holder["service"].engine_core.stop()
  log.info("stopped")
  return 1 if holder.get("failed") else 0
