"""The lm-eval model `flash_dllm_jax`: a checkpoint decoded by one strategy.

  python -m flash_dllm_jax.lm_eval --model flash_dllm_jax --batch_size 32
      --model_args pretrained=DIR,strategy=NAME,gen_length=256,
      block_length=32,threshold=0.9,chat=true

generate_until: contexts (with chat=true, each as one user turn of the
checkpoint's chat template) are tokenized without BOS, grouped by padded
prompt length (prompts.PROMPT_BUCKET) and decoded through the compiled
`generate`, batch_size rows at a time with the last batch of a bucket
padded by copies to batch_size / 8, / 4, / 2 or batch_size rows (at most
four compiles per bucket; `padded_rows`), or, for strategies that refill
slots, every row of a bucket in one call through batch_size slots
(continuous batching; not combined with mesh=). Row i of a call uses seed
seed + i, so an answer does not depend on its batch. An answer ends at the
first EOS/EOT, then at the earliest `until` string.

Gen length: gen_length from model_args when given (the reference
adapters' fixed canvas; the task's max_gen_toks is then not applied), else
the task's max_gen_toks (default 256) rounded up to a multiple of the
sampler's block_length (32 for samplers without one), with the answer cut
to max_gen_toks tokens; LLaDA's and Dream's samplers then also take
steps = gen length unless steps is given. diffusion-gemma, whose answers
end at any length, takes max_out_length = max_gen_toks (unless model_args
give it). model_args temperature / top_p / top_k sample, per row for a
strategy without such fields (strategies.build, as the CLI and the server
take them; DiffusionGemma's temperature through its family's mapping); a
request's own temperature (gen_kwargs; do_sample false: 0) decodes its
row unless model_args state one (gen_kwargs.py).

loglikelihood: likelihood.py (LLaDA's / Dream's Monte-Carlo estimate), the
noisy copies of all requests batch_size rows per forward; request i draws
its masks from NumPy generator (seed, i), so its score depends on the
seed, mc_num, mc_group, cfg and sampling_eps, not on batch_size. Batch
sizes are clipped to the requests and to the memory (memory.py: an
estimate per row against memory_gib, else the device's free memory), with
one warning line. is_greedy
is always False (the references' is_check_greedy=False).
loglikelihood_rolling is refused.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from flash_dllm_jax import architectures, parallel
from flash_dllm_jax.checkpoint import load, load_config
from flash_dllm_jax.compilation import compile_clock
from flash_dllm_jax.generate import answer_ids, generate
from flash_dllm_jax.lm_eval import gen_kwargs
from flash_dllm_jax.lm_eval.args import ModelArgsError, parse
from flash_dllm_jax.lm_eval.loglikelihood import Loglikelihood
from flash_dllm_jax.lm_eval.memory import BatchBound
from flash_dllm_jax.lm_eval.stats import Throughput
from flash_dllm_jax.prompts import bucket_groups, padded_length
from flash_dllm_jax.sampling import Refillable
from flash_dllm_jax.strategies import STRATEGIES, build, sampler_options

INSTANCES: list["FlashDLLMJax"] = []  # for __main__'s throughput file
# The answer-length option of the canvas sampler (diffusion-gemma), which
# stops at any length: it takes the task's max_gen_toks as it is.
ANSWER_LENGTH = "max_out_length"


@register_model("flash_dllm_jax")
class FlashDLLMJax(Loglikelihood, LM):
  """See the module docstring; keywords as in args.AdapterArgs plus the
  strategy's sampler options."""

  def __init__(self, **model_args: Any):
    super().__init__()
    self.args, self.options = parse(model_args)
    try:
      self.arch = load_config(self.args.checkpoint).arch
    except (FileNotFoundError, ValueError) as e:  # not a checkpoint
      raise ModelArgsError(f"bad model_args for flash_dllm_jax: pretrained="
                           f"{self.args.checkpoint!r}: {e}") from None
    self.strategy = self.args.strategy or (
        self.arch if self.arch in STRATEGIES
        else architectures.get(self.arch).default_strategy)
    self._sampler_cache: dict[int, tuple[Any, int | None]] = {}
    self.sampling = None  # every row's Sampling (strategies.build), or None
    self.sampler_for(self.args.max_gen_toks)  # bad sampler options fail now
    self.mesh = parallel.parse_mesh(self.args.mesh_spec)
    self.params, self.config, self.tokenizer = load(
        self.args.checkpoint, dtype=self.args.dtype, mesh=self.mesh)
    if self.tokenizer is None:
      raise ValueError(f"checkpoint {self.args.checkpoint} has no tokenizer")
    self.bound = BatchBound(  # after load
        self.config, self.args.memory_gib,
        self.options.get("kv_cache_dtype", "auto"))
    self.generated, self.scored = Throughput(), Throughput()
    INSTANCES.append(self)

  # lm-eval passes its --batch_size (default 1; a string from its CLI) and
  # --max_batch_size beside model_args; a batch_size inside model_args wins.
  @classmethod
  def create_from_arg_obj(cls, arg_dict, additional_config=None):
    extra = {k: v for k, v in (additional_config or {}).items()
             if v is not None and k not in arg_dict}
    return cls(**arg_dict, **extra)

  @classmethod
  def create_from_arg_string(cls, arg_string, additional_config=None):
    from lm_eval.utils import simple_parse_args_string
    return cls.create_from_arg_obj(simple_parse_args_string(arg_string),
                                   additional_config)

  # Samplers -----------------------------------------------------------------
  def sampler_for(self, max_gen_toks: int):
    """(sampler, token cut or None) for a task's max_gen_toks (module doc)."""
    if max_gen_toks not in self._sampler_cache:
      options, cut = dict(self.options), None
      fields = sampler_options(STRATEGIES[self.strategy].sampler)
      if ANSWER_LENGTH in fields:  # DiffusionGemma's: any answer length
        options.setdefault(ANSWER_LENGTH, max_gen_toks)
      elif "gen_length" not in options:
        unit = options.get("block_length") or (
            fields["block_length"][1] if "block_length" in fields else None)
        unit = unit or 32
        options["gen_length"] = -(-max_gen_toks // unit) * unit
        if "steps" in fields and isinstance(fields["steps"][1], int):
          options.setdefault("steps", options["gen_length"])
        cut = max_gen_toks
      try:  # temperature / top_p / top_k: per row where no field takes them
        sampler, self.sampling = build(self.strategy, self.arch, options)
      except (ValueError, TypeError) as e:
        raise ModelArgsError(f"bad model_args for flash_dllm_jax: {e}"
                             ) from None
      self._sampler_cache[max_gen_toks] = (sampler, cut)
    return self._sampler_cache[max_gen_toks]

  # generate_until -------------------------------------------------------------
  def _prompt_ids(self, context: str) -> list[int]:
    if self.args.chat:
      context = self.tokenizer.apply_chat_template(
          [{"role": "user", "content": context}], add_generation_prompt=True)
    ids = self.tokenizer.encode(context)
    if not ids:
      raise ValueError("generate_until got an empty context")
    return ids

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    out: list[str | None] = [None] * len(requests)
    by_length: dict[int, list[int]] = {}
    for i, request in enumerate(requests):
      toks = request.args[1].get("max_gen_toks", self.args.max_gen_toks)
      if not isinstance(toks, int) or toks < 1:
        raise ValueError(f"request {i}: max_gen_toks must be a positive int, "
                         f"got {toks!r}")
      by_length.setdefault(toks, []).append(i)
    bar = tqdm(total=len(requests), disable=disable_tqdm,
               desc=f"flash_dllm_jax {self.strategy}")
    with bar:
      for toks, idx in by_length.items():
        self._generate_group(requests, idx, toks, out, bar)
    return out

  def _generate_group(self, requests, idx, max_gen_toks, out, bar) -> None:
    sampler, cut = self.sampler_for(max_gen_toks)
    rows = [self._prompt_ids(requests[i].args[0]) for i in idx]
    row_of = dict(zip(idx, rows))
    for i, row in zip(idx, rows):
      padded = padded_length(len(row))
      try:
        sampler.check_prompt(padded, self.config.max_seq_len)
      except ValueError as e:
        raise ValueError(f"request {i} ({len(row)} prompt tokens, padded to "
                         f"{padded}): {e}") from None
    refill = isinstance(sampler, Refillable) and self.mesh is None
    b = self.bound.rows(  # rows: never past the requests nor the memory
        "generate_until", min(self.args.batch_size, len(idx)),
        max(map(padded_length, map(len, rows))) + sampler.gen_length)
    for bucket in bucket_groups(rows):
      members = [idx[j] for j in bucket]
      chunks = ([members] if refill
                else [members[s:s + b] for s in range(0, len(members), b)])
      for chunk in chunks:
        n_pad = 0 if refill else padded_rows(len(chunk), b) - len(chunk)
        ids = [row_of[i] for i in chunk] + [row_of[chunk[-1]]] * n_pad
        seeds = [self.args.seed + i for i in chunk] + \
            [self.args.seed + chunk[-1]] * n_pad
        rows_sampling = [gen_kwargs.row(
            sampler, self.options, self.sampling,
            gen_kwargs.temperature_of(requests[i].args[1], i))
            for i in chunk]
        rows_sampling += rows_sampling[-1:] * n_pad
        sampling = (self.sampling if all(r == self.sampling
                                         for r in rows_sampling)
                    else rows_sampling)
        with compile_clock() as compiled:
          t0 = time.perf_counter()
          res = generate((self.params, self.config, self.tokenizer), ids,
                         sampler=sampler, seed=seeds, sampling=sampling,
                         stop_at_eos=self.args.stop_at_eos, mesh=self.mesh,
                         batch_size=b if refill else None)
          wall = time.perf_counter() - t0
        tokens = 0
        for r, i in enumerate(chunk):
          answer = answer_ids(res.tokens_BxG[r], self.config)
          tokens += min(len(answer) + 1, sampler.gen_length)
          text = self.tokenizer.decode(answer[:cut] if cut else answer)
          out[i] = cut_at_until(text, requests[i].args[1].get("until"))
        n = len(chunk)
        self.generated.add(requests=n, tokens=tokens,
                           steps=int(res.steps_B[:n].sum()),
                           forwards=int(res.forwards_B[:n].sum()),
                           wall_s=wall, compile_s=compiled[0])
        bar.update(n)

  # Chat templates and run info --------------------------------------------------
  def apply_chat_template(self, chat_history, add_generation_prompt=True):
    return self.tokenizer.apply_chat_template(
        chat_history, add_generation_prompt=add_generation_prompt)

  @property
  def tokenizer_name(self) -> str:
    return str(self.args.checkpoint).rstrip("/").replace("/", "__")

  def chat_template(self, chat_template=False) -> str | None:
    return self.tokenizer.config.get("chat_template")

  def get_model_info(self) -> dict:
    """Merged by lm-eval into its results' `config`."""
    samplers = {str(k): dataclasses.asdict(s)
                for k, (s, _) in self._sampler_cache.items()}
    return {"flash_dllm_jax": {
        "checkpoint": str(self.args.checkpoint), "arch": self.config.arch,
        "strategy": self.strategy, "adapter": dataclasses.asdict(self.args),
        "samplers_by_max_gen_toks": samplers, "sampling": None
        if self.sampling is None else dataclasses.asdict(self.sampling),
        "device": jax.devices()[0].device_kind, "jax": jax.__version__,
        "throughput": self.throughput()}}

  def throughput(self) -> dict:
    return {"generate_until": self.generated.summary(),
            "loglikelihood": self.scored.summary()}


def padded_rows(n: int, batch_size: int) -> int:
  """Rows a batch of n <= batch_size is padded to: the smallest of
  batch_size, batch_size / 2, / 4, / 8 (rounded up) holding n, so a bucket
  compiles at most four batch shapes and pads a remainder less than 2x."""
  sizes = sorted({-(-batch_size // 2 ** k) for k in range(4)})
  return next(size for size in sizes if size >= n)


def cut_at_until(text: str, until) -> str:
  """text up to the earliest of the stop strings (a str or a list)."""
  stops = [until] if isinstance(until, str) else list(until or [])
  ends = [text.find(s) for s in stops if s]
  ends = [e for e in ends if e != -1]
  return text[:min(ends)] if ends else text
