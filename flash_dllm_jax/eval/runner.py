"""Batched, resumable evaluation: prompts -> compiled `generate` -> scores.

Problems still missing from the run's JSONL are sorted by prompt length
(longest first: less padding per batch, and a too-long batch fails first)
and decoded B at a time. Results do not depend on batch composition
(per-row seeds, pad-relative positions, and `generate` decodes each
prompt-length bucket as its own batch, so a row's padding is its own), so
sorting, padding the last batch with copies of a row, and resuming all
leave every answer unchanged. (Tested on CPU; on a GPU, XLA may pick other
matmul algorithms for other batch sizes, which this does not rule out.)

A problem whose prompt cannot be decoded (it holds the mask token, or is too
long for the model's context with the generation) is recorded with its
error as a wrong answer, and the run goes on; the summary counts such
problems (`undecodable`). A run where no prompt fits is refused before
anything is written.

Timing per batch: wall seconds of the whole `generate` call (tokenizing,
padding, the device decode, transfers, detokenizing), and the part of them
that JAX spent tracing and compiling (a new prompt-length bucket compiles
once); throughput excludes the compile part. Scoring (and HumanEval's test
runs) happens outside the timed region.

Several processes (hosts; see `parallel.initialize_distributed`): process
p of n takes problems i with i % n == p, writes records.p-of-n.jsonl in the
shared run directory, and after a barrier process 0 merges the shards into
records.jsonl and writes the summary of all problems.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from flash_dllm_jax import parallel
from flash_dllm_jax.eval.records import peak_memory_bytes
from flash_dllm_jax.eval import report
from flash_dllm_jax.eval.records import RecordStore, merge_shards, open_run, \
    shard_name
from flash_dllm_jax.eval.tasks import Problem, make_render
from flash_dllm_jax.generate import generate
from flash_dllm_jax.compilation import compile_clock
from flash_dllm_jax.sampling import Refillable, checks



def prompt_sha256(prompt: str) -> str:
  return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def answer_length(gen_G: np.ndarray, stop_ids: Sequence[int]) -> int:
  """Generated tokens up to and including the first stop token (EOS/EOT)."""
  hits = np.flatnonzero(np.isin(gen_G, list(stop_ids)))
  return int(hits[0]) + 1 if hits.size else int(gen_G.shape[0])


def unfit_errors(problems: Sequence[Problem], lengths: Sequence[int],
                 sampler, max_seq_len: int) -> dict[str, str]:
  """{id: why} of every prompt that cannot fit with the generation (real
  lengths: `generate` caps bucket padding at the room the model leaves).
  When none fits, one error naming them all: the settings, not a problem,
  are wrong."""
  bad = checks.unfit_prompts(lengths, sampler, max_seq_len)
  if bad and len(bad) == len(problems):
    named = ", ".join(f"{problems[i].id} ({n} tokens)" for i, n, _ in bad)
    raise ValueError(
        f"{len(bad)} prompt(s) do not fit the model's context: {named}; "
        f"{bad[0][2]}; use shorter prompts (fewer few-shot examples, no chat "
        "template), a shorter --gen-length or a model with a longer "
        "max_seq_len")
  return {problems[i].id: f"its prompt ({n} tokens) does not fit the "
          f"model's context: {why}" for i, n, why in bad}


def prompt_lengths(problems: Sequence[Problem], tokenizer,
                   config) -> tuple[dict[str, int], dict[str, str]]:
  """({id: prompt tokens}, {id: why it cannot be decoded}): a prompt that
  does not tokenize, or holds the mask token or ids outside the vocabulary,
  fails its own problem, not the run."""
  lengths, errors = {}, {}
  for p in problems:
    try:
      ids = tokenizer.encode(p.prompt)
    except (ValueError, TypeError) as e:
      errors[p.id] = f"its prompt does not tokenize: {e}"
      continue
    why = checks.token_error(ids, config.mask_token_id, config.vocab_size)
    if why:
      errors[p.id] = f"its prompt {why}"
    else:
      lengths[p.id] = len(ids)
  return lengths, errors


def error_record(problem: Problem, error: str, batch_size: int) -> dict:
  """The record of a problem that was not decoded: wrong, no tokens, in no
  batch, with the error."""
  return {"id": problem.id, "prompt_sha256": prompt_sha256(problem.prompt),
          "error": error, "output": None, "correct": False,
          "raw_output": None, "tokens": 0, "token_ids": [], "forwards": 0,
          "steps": 0, "wall_s": 0.0, "compile_s": 0.0, "batch": None,
          "batch_rows": 0, "batch_size": batch_size,
          "peak_device_bytes": None}


CHUNK_BATCHES = 8  # continuous batching: batches per generate call


def run_eval(task, model, sampler, run_dir: str | Path,
             settings: dict[str, Any], *, batch_size: int,
             limit: int | None = None, seed: int = 0, stop_at_eos: bool = True,
             progress: bool = True, mesh=None,
             on_batch: Callable[[int], None] | None = None,
             process: tuple[int, int] | None = None,
             sampling=None) -> dict[str, Any] | None:
  """Evaluates task's first `limit` problems (all if None), resuming from
  run_dir/records.jsonl; writes run_dir/summary.json and returns it.

  model: (params, config, tokenizer) as `load` returns it. settings: what
  the run records in run.json (must match on resume). on_batch(i) is called
  after batch i is saved (tests use it to simulate an interruption).
  process: (index, count) of this process (default: JAX's); with count > 1
  this process decodes its share, and only process 0 merges and returns the
  summary (the others return None). sampling: every row's draw settings
  (a Sampling) for a strategy that samples per row (None: its own).
  """
  if not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch size must be a positive int, got {batch_size!r}")
  if limit is not None and (not isinstance(limit, int) or limit < 1):
    raise ValueError(f"limit must be a positive int, got {limit!r}")
  _, config, tokenizer = model
  checks.check_seeds([seed], "seed")
  if tokenizer is None:
    raise ValueError("the checkpoint has no tokenizer; evaluation needs one")
  problems = task.problems(make_render(tokenizer, task.chat))
  problems = problems[:limit] if limit else problems
  if problems and seed + max(p.index for p in problems) >= checks.SEED_LIMIT:
    raise ValueError(f"seed {seed} is too large: problem i uses seed + i, "
                     f"and seeds must be below 2**32 (here up to "
                     f"{seed + max(p.index for p in problems)})")
  lengths, errors = prompt_lengths(problems, tokenizer, config)
  fit = [p for p in problems if p.id in lengths]
  errors.update(unfit_errors(fit, [lengths[p.id] for p in fit], sampler,
                             config.max_seq_len))
  lengths = {i: n for i, n in lengths.items() if i not in errors}
  index, count = process or (parallel.process_index(),
                             parallel.process_count())
  if not 0 <= index < count:
    raise ValueError(f"process index {index} outside [0, {count})")
  if count == 1:
    store = open_run(run_dir, settings)
    done = store.records
  else:
    store = open_run(run_dir, settings, shard_name(index, count))
    done = {**RecordStore(Path(run_dir) / "records.jsonl").records,
            **store.records}
  mine = problems if count == 1 else problems[index::count]
  for p in problems:
    record = done.get(p.id)
    if record and record["prompt_sha256"] != prompt_sha256(p.prompt):
      raise ValueError(f"{store.path}: {p.id} was generated from a different "
                       "prompt (data or template changed); use a new run")
  failed = [p for p in mine if p.id in errors and p.id not in done]
  for p in failed:
    print(f"warning: {p.id} cannot be decoded ({errors[p.id]}); recorded as "
          "an error", file=sys.stderr)
  if failed:
    store.append([error_record(p, errors[p.id], batch_size) for p in failed])
  todo = sorted((p for p in mine if p.id not in done and p.id in lengths),
                key=lambda p: -lengths[p.id])

  # Samplers that can refill slots decode a chunk of several batches through
  # batch_size slots (continuous batching); others decode one padded batch.
  refill = isinstance(sampler, Refillable) and mesh is None
  chunk = batch_size * (CHUNK_BATCHES if refill else 1)
  bar = tqdm(total=len(mine), initial=len(mine) - len(todo),
             desc=f"{task.name} {settings.get('strategy', '')}".strip(),
             unit="problem", disable=not progress, dynamic_ncols=True)
  tokens_done, seconds_done = 0, 0.0
  with bar, compile_clock() as compiled:
    for i in range(0, len(todo), chunk):
      batch = todo[i:i + chunk]
      rows = batch if refill else batch + [batch[-1]] * (chunk - len(batch))
      before, t0 = compiled[0], time.perf_counter()
      out = generate(model, [p.prompt for p in rows], sampler=sampler,
                     chat=False,  # the task rendered the prompt
                     seed=[seed + p.index for p in rows],
                     stop_at_eos=stop_at_eos, mesh=mesh, sampling=sampling,
                     batch_size=batch_size if refill else None)
      wall = time.perf_counter() - t0
      compile_s = min(compiled[0] - before, wall)
      scores = task.score(batch, out.texts[:len(batch)])
      batch_id, peak = uuid.uuid4().hex[:12], peak_memory_bytes()
      records = []
      for b, (p, score) in enumerate(zip(batch, scores)):
        n = answer_length(out.tokens_BxG[b], config.stop_token_ids)
        records.append({
            "id": p.id, "prompt_sha256": prompt_sha256(p.prompt),
            **score, "raw_output": out.texts[b], "tokens": n,
            "token_ids": out.tokens_BxG[b, :n].tolist(),
            "forwards": int(out.forwards_B[b]),
            "steps": int(out.steps_B[b]),
            "wall_s": round(wall, 6), "compile_s": round(compile_s, 6),
            "batch": batch_id, "batch_rows": len(batch),
            "batch_size": batch_size, "peak_device_bytes": peak})
      store.append(records)
      tokens_done += sum(r["tokens"] for r in records)
      seconds_done += wall - compile_s
      bar.update(len(batch))
      bar.set_postfix(tok_s=f"{tokens_done / max(seconds_done, 1e-9):.1f}")
      if on_batch is not None:
        on_batch(i // chunk)
  if count > 1:
    parallel.barrier(f"eval {Path(run_dir).name}")
    if index != 0:
      return None
    store = merge_shards(run_dir, count)
  summary = report.summarize(
      [store.records[p.id] for p in problems if p.id in store.records],
      task=task.name, metric=task.metric, settings=settings,
      limit=limit, run_name=Path(run_dir).name)
  summary["device"] = jax.devices()[0].device_kind
  report.write_summary(Path(run_dir) / "summary.json", summary)
  return summary


def run_name(strategy: str, settings: dict[str, Any]) -> str:
  """Default run directory name: the strategy and a hash of the settings, so
  rerunning the same command resumes and another configuration does not."""
  digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
  return f"{strategy}-{digest.hexdigest()[:8]}"
