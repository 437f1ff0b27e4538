"""Trains the project's small LLaDA-format dLLM on the synthetic GSM corpus.

  python scripts/make_synthetic_gsm.py runs/synthetic_gsm --train 200000
  python scripts/train_tiny.py --data runs/synthetic_gsm --out runs/train_tiny
  python scripts/train_tiny.py --smoke          # a few CPU steps, tiny model
  python scripts/train_tiny.py --data data/synthetic_gsm --stream ...
      # fresh problems drawn while training (train.jsonl not needed)

Default model: 8 layers, d_model 384, 6 heads of 64 (MHA, as LLaDA-8B),
SwiGLU width 768, vocabulary 1024: 12.6M parameters, 25.2 MB of bfloat16
values that orbax stores in about 19.7 MB (the shipped limit is 25 MB on
disk). Depth over width, since the problems chain dependent calculations;
the width is what the size budget leaves. The shipped model adds depth
(--layers 10: 15.5M parameters, 24.4 MB on disk; its model card). Rows are
320 tokens (prompt <= 108 and solution <= 176 tokens with digits split).
Batch 256 x 6000 steps of AdamW (peak lr 1e-3, 200 warmup steps, cosine
to 1e-4); step times are in BENCHMARKS.md ("Training").
--max-minutes stops (and saves) at that wall time; with --fit-to-time the
cosine schedule is fitted to it instead. --stop-after-minutes pauses (and
saves) without changing the schedule, so one schedule can span two device
calls of at most 10 minutes each:

  python scripts/train_tiny.py --data D --out runs/t --mesh data=2 \
      --fit-to-time --max-minutes 14 --steps 100000 --stop-after-minutes 8
  (the same command again continues the fitted schedule to its end)

--stream draws every batch fresh from the synthetic train stream
(flash_dllm_train/stream.py: batch s is problems s*B..s*B+B-1 of
--data-seed, tokenized by --stream-workers processes ahead of the loop, no
draw served twice, though two draws can share a question); the questions of --data's test.jsonl (and ood.jsonl)
are never trained on. A resumed run continues the stream at its step.

Outputs in OUT: metrics.jsonl, loss.png, checkpoints/step_*/ (resumable:
rerun the same command) and model/ (the bfloat16 checkpoint to ship).
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from flash_dllm_jax.checkpoint import load  # noqa: E402
from flash_dllm_jax.eval.records import peak_memory_bytes  # noqa: E402
from flash_dllm_data import synthetic_gsm  # noqa: E402
from flash_dllm_data.tokenizer_builder import (  # noqa: E402
    build_tokenizer, corpus_texts, special_ids)
from flash_dllm_jax.tokenizer import Tokenizer  # noqa: E402
from flash_dllm_train import checkpoints as ckpt, models  # noqa: E402
from flash_dllm_train.data import EOS_PAD, encode_problems  # noqa: E402
from flash_dllm_train.canvas_objective import TIME_EPS  # noqa: E402
from flash_dllm_train.evaluate import solve_accuracy  # noqa: E402
from flash_dllm_train.models import GEMMA  # noqa: E402
from flash_dllm_train.stream import StreamBatches  # noqa: E402
from flash_dllm_train.train import (  # noqa: E402
    TrainConfig, train)
from flash_dllm_train.run_log import scheduled_steps  # noqa: E402

MODEL_ARGS = ("arch", "layers", "d_model", "heads", "kv_heads", "mlp_hidden",
              "vocab_size", "rope_theta", "max_seq_len", "experts", "top_k",
              "expert_hidden", "shared_experts", "dense_layers",
              "sliding_window", "global_every")
SMOKE = dict(steps=6, batch_size=4, layers=2, d_model=64, heads=4,
             kv_heads=4, mlp_hidden=128, log_every=2, eval_every=3,
             ckpt_every=3, eval_problems=2, gen_length=32, expert_hidden=32,
             sliding_window=16, global_every=2)


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--data", type=Path, help="dir with train.jsonl, test.jsonl "
                  "(scripts/make_synthetic_gsm.py); --smoke makes a small one")
  ap.add_argument("--out", type=Path, default=None,
                  help="run dir (default runs/train_tiny[_smoke])")
  ap.add_argument("--smoke", action="store_true",
                  help="a few CPU steps of a tiny model on a small corpus")
  ap.add_argument("--stream", action="store_true",
                  help="train on fresh problems drawn while training (the "
                  "train stream of --data-seed) instead of --data's "
                  "train.jsonl; --data's test.jsonl (and ood.jsonl) "
                  "questions are never drawn")
  ap.add_argument("--data-seed", type=int, default=0,
                  help="--stream: seed of the problem stream (0: its first "
                  "problems are make_synthetic_gsm --seed 0's train split)")
  ap.add_argument("--phrasing", choices=synthetic_gsm.PHRASINGS,
                  default=synthetic_gsm.DEFAULT_PHRASING,
                  help="--stream (and --smoke): wording of the drawn "
                  "solutions (flash_dllm_data/phrasing.py)")
  ap.add_argument("--stream-workers", type=int,
                  default=max(1, min(8, (os.cpu_count() or 2) - 2)),
                  help="--stream: processes drawing batches ahead (0: in "
                  "the training process)")
  ap.add_argument("--tokenizer", type=Path, default=None,
                  help="use this saved tokenizer instead of building one")
  ap.add_argument("--init-from", type=Path, default=None,
                  help="warm start: a model directory (e.g. the shipped "
                  "checkpoint) whose weights, config and tokenizer replace "
                  "the random init; fresh optimizer state and schedule")
  g = ap.add_argument_group("model")
  g.add_argument("--arch", choices=models.ARCHS, default="llada",
                 help="llada: dense, full attention, LLaDA's SFT objective; "
                 "llada2: block-causal MoE, the block-diffusion objective; "
                 "diffusion_gemma: Gemma 4 layers, local and global, an MoE "
                 "beside a dense MLP, self-conditioning, DiffusionGemma's "
                 "SFT objective (uniform noise, canvases of --block-length)")
  g.add_argument("--layers", type=int, default=8)
  g.add_argument("--d-model", type=int, default=384)
  g.add_argument("--heads", type=int, default=6)
  g.add_argument("--kv-heads", type=int, default=None, help="default: heads")
  g.add_argument("--mlp-hidden", type=int, default=768)
  g.add_argument("--vocab-size", type=int, default=1024)
  g.add_argument("--rope-theta", type=float, default=10000.0)
  g.add_argument("--max-seq-len", type=int, default=1024)
  g.add_argument("--experts", type=int, default=8, help="llada2, "
                 "diffusion_gemma: routed experts (--top-k per token, width "
                 "--expert-hidden)")
  g.add_argument("--top-k", type=int, default=2)
  g.add_argument("--expert-hidden", type=int, default=128)
  g.add_argument("--shared-experts", type=int, default=1)
  g.add_argument("--dense-layers", type=int, default=1,
                 help="llada2: first layers with the dense MLP")
  g.add_argument("--block-length", type=int, default=32,
                 help="llada2: decode block of the objective and final "
                 "check; diffusion_gemma: the canvas length")
  g.add_argument("--sliding-window", type=int, default=128,
                 help="diffusion_gemma: the local layers' window")
  g.add_argument("--global-every", type=int, default=4,
                 help="diffusion_gemma: every Nth layer is global")
  g.add_argument("--dtype", choices=["bfloat16", "float32"],
                 default="bfloat16", help="compute dtype (params are f32)")
  t = ap.add_argument_group("training")
  t.add_argument("--steps", type=int, default=6000)
  t.add_argument("--batch-size", type=int, default=256)
  t.add_argument("--seq-len", type=int, default=320)
  t.add_argument("--lr", type=float, default=1e-3)
  t.add_argument("--warmup-steps", type=int, default=200)
  t.add_argument("--weight-decay", type=float, default=0.1)
  t.add_argument("--eos-pad", choices=EOS_PAD, default="random")
  t.add_argument("--seed", type=int, default=0)
  t.add_argument("--log-every", type=int, default=50)
  t.add_argument("--eval-every", type=int, default=250)
  t.add_argument("--ckpt-every", type=int, default=1000)
  t.add_argument("--max-minutes", type=float, default=None)
  t.add_argument("--stop-after-minutes", type=float, default=None,
                 help="pause (and save) after this wall time; rerun with the "
                      "same --out and arguments to continue the schedule")
  t.add_argument("--stop-after-steps", type=int, default=None,
                 help="pause (and save) after this many steps of this "
                      "invocation; rerun to continue, as above")
  t.add_argument("--mesh", default=None,
                 help="data=D: split each batch over D devices (data "
                 "parallel); the same run as one device up to float order")
  t.add_argument("--implementation", default=None,
                 choices=["pallas", "pallas_interpret", "reference"],
                 help="model ops (default: fused cuDNN attention on a GPU; "
                 "'reference' materialises the scores)")
  t.add_argument("--fit-to-time", action="store_true",
                 help="time the first warmup steps, then shorten --steps so "
                 "the whole cosine schedule ends within --max-minutes")
  e = ap.add_argument_group("final check")
  e.add_argument("--eval-problems", type=int, default=128,
                 help="held-out problems decoded at the end (0: none)")
  e.add_argument("--gen-length", type=int, default=192)
  return ap


def main(argv=None):
  ap = _parser()
  args = ap.parse_args(argv)
  if args.smoke:  # smoke values replace defaults the user left alone
    for k, v in SMOKE.items():
      if getattr(args, k) == ap.get_default(k) and not (
          args.init_from and k in MODEL_ARGS):
        setattr(args, k, v)
  out = args.out or Path("runs/train_tiny_smoke" if args.smoke
                         else "runs/train_tiny")
  t0 = time.time()
  held_out = []  # questions training must never see (--stream)
  if args.data is not None:
    test_rows = synthetic_gsm.read_jsonl(args.data / "test.jsonl")
    held_out = [r["question"] for r in test_rows]
    if (args.data / "ood.jsonl").is_file():
      held_out += [r["question"] for r in
                   synthetic_gsm.read_jsonl(args.data / "ood.jsonl")]
    train_rows = (None if args.stream else
                  synthetic_gsm.read_jsonl(args.data / "train.jsonl"))
  elif args.smoke:
    train_rows = synthetic_gsm.generate(512, 0, "train",
                                        phrasing=args.phrasing)
    test_rows = synthetic_gsm.generate(32, 1, "test", phrasing=args.phrasing)
    held_out = [r["question"] for r in test_rows]
  else:
    ap.error("--data is required (make it with scripts/make_synthetic_gsm.py)")
  if args.stream:
    train_rows = None  # drawn while training
  init_from = None
  if args.init_from is not None:
    changed = [f"--{k.replace('_', '-')}" for k in MODEL_ARGS
               if getattr(args, k) != ap.get_default(k)]
    if changed or args.tokenizer:
      ap.error(f"--init-from takes the model and tokenizer from "
               f"{args.init_from}; drop {' '.join(changed) or '--tokenizer'}")
    # Unfused, the layout training builds (load joins q/k/v on a GPU).
    init_from, init_config, init_tokenizer = load(args.init_from,
                                                  fuse_qkv=False)
    if init_tokenizer is None:
      ap.error(f"--init-from {args.init_from}: no tokenizer.json there")
  found = ckpt.list_checkpoints(out)
  if found:  # resume with the tokenizer the run was started with
    tokenizer = Tokenizer.from_dir(found[-1][1] / "model")
  elif init_from is not None:
    tokenizer = init_tokenizer
  elif args.tokenizer:
    tokenizer = Tokenizer.from_dir(args.tokenizer)
  else:  # from the first 50,000 train problems (the stream's, if --stream)
    if train_rows is None:
      train_rows = synthetic_gsm.generate(
          512 if args.data is None else 50000, args.data_seed, "train",
          workers=max(1, args.stream_workers), phrasing=args.phrasing)
    tokenizer, _ = build_tokenizer(corpus_texts(train_rows[:50000]),
                                   args.vocab_size, args.arch)
  config = models.train_config(
      args.arch, special_ids(tokenizer), vocab_size=tokenizer.vocab_size,
      layers=args.layers, d_model=args.d_model, heads=args.heads,
      kv_heads=args.kv_heads, mlp_hidden=args.mlp_hidden,
      rope_theta=args.rope_theta, max_seq_len=args.max_seq_len,
      dtype=args.dtype, experts=args.experts, top_k=args.top_k,
      expert_hidden=args.expert_hidden, shared_experts=args.shared_experts,
      dense_layers=args.dense_layers, sliding_window=args.sliding_window,
      global_every=args.global_every)
  if init_from is not None:
    config = init_config.replace(dtype=args.dtype)
  if args.stream:
    rows = StreamBatches(tokenizer, args.seq_len, args.batch_size, args.seed,
                         args.data_seed, held_out, args.eos_pad,
                         args.stream_workers, phrasing=args.phrasing)
    rows.start(found[-1][0] if found else 0)  # draw while JAX compiles
    what = (f"fresh problems (stream seed {args.data_seed}, "
            f"{args.phrasing} phrasing, "
            f"{args.stream_workers} workers, {len(set(held_out))} held-out "
            "questions excluded)")
  else:
    rows = encode_problems(train_rows, tokenizer, args.seq_len)
    what = (f"{len(rows.tokens_MxN)} train rows ({rows.dropped} longer than "
            f"{args.seq_len} dropped)")
  eval_rows = encode_problems(test_rows, tokenizer, args.seq_len)
  print(f"{what}, {len(eval_rows.tokens_MxN)} eval rows; "
        f"model {models.num_params(config) / 1e6:.2f}M params, "
        f"{models.num_params(config) * 2 / 1e6:.1f} MB in bf16; devices "
        f"{jax.devices()}; data ready in {time.time() - t0:.0f}s", flush=True)
  tc = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                   warmup_steps=min(args.warmup_steps, args.steps - 1),
                   weight_decay=args.weight_decay, seed=args.seed,
                   log_every=args.log_every, eval_every=args.eval_every,
                   ckpt_every=args.ckpt_every, max_minutes=args.max_minutes,
                   fit_to_time=args.fit_to_time,
                   implementation=args.implementation,
                   stop_after_minutes=args.stop_after_minutes,
                   stop_after_steps=args.stop_after_steps,
                   eos_pad=args.eos_pad, block_length=args.block_length,
                   **({"eps": TIME_EPS} if config.arch == GEMMA else {}))
  t1 = time.time()
  try:
    params, step = train(config, tokenizer, rows, out, tc, eval_rows,
                         log=lambda s: print(s, flush=True), mesh=args.mesh,
                         init_from=init_from)
  finally:
    if args.stream:
      rows.close()
  peak = peak_memory_bytes()  # None on the CPU
  print(f"trained to step {step} in {(time.time() - t1) / 60:.1f} min"
        + ("" if peak is None else f" (device peak {peak / 1e9:.2f} GB)"))
  if args.stream:
    print(f"stream: {rows.replaced_held_out} held-out and "
          f"{rows.replaced_long} too-long draws replaced in this invocation")
  paused = (args.stop_after_minutes is not None
            or args.stop_after_steps is not None)
  if paused and step < scheduled_steps(out, tc):
    print(f"paused at step {step} of {scheduled_steps(out, tc)}: rerun the "
          "same command to continue; no model exported yet")
    return
  size = ckpt.export_model(out / "model", params, config, tokenizer)
  print(f"wrote {out / 'model'} ({size / 1e6:.2f} MB), {out / 'loss.png'}")
  if args.eval_problems > 0:
    model = load(out / "model")
    block = args.block_length if config.arch == "llada2" else 32
    if config.arch == GEMMA:  # its sampler's defaults, the trained canvas
      block = args.block_length
      options = dict(canvas_length=block, max_out_length=args.gen_length)
    else:
      options = dict(gen_length=args.gen_length, block_length=block,
                     steps=block if config.arch == "llada2"
                     else args.gen_length)
    acc, results = solve_accuracy(  # the architecture's default sampler
        model, test_rows[:args.eval_problems], **options)
    for question, text, predicted, target in results[:3]:
      print(f"--- {question}\n{text}\n(predicted {predicted}, target "
            f"{target})")
    print(f"held-out accuracy {acc:.3f} on {len(results)} problems "
          f"(gen_length {args.gen_length}, {config.spec.default_strategy} "
          f"sampler, block {block})")


if __name__ == "__main__":
  main()
