"""Writes the synthetic GSM8K-like corpus: OUT/{train,test,ood}.jsonl, info.json.

  python scripts/make_synthetic_gsm.py runs/synthetic_gsm --train 200000 \
      --test 1000 --seed 0

Rows are GSM8K's {"question", "answer"} (worked solution with <<a*b=c>>
annotations, last line "#### N") plus "template" and "steps". The test split
uses another seed (--test-seed, default seed + 1) and another mix of the
train templates, minus any question that occurs in train. The optional ood
split (--ood) uses templates and names train never sees: a generalisation
probe, not the quality target. --phrasing varied (default) rewords steps at
random; the questions are the same under both phrasings. Every answer is
re-checked after writing.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flash_dllm_data.gsm_format import check_solution  # noqa: E402
from flash_dllm_data.synthetic_gsm import (  # noqa: E402
    DEFAULT_PHRASING, PHRASINGS, read_jsonl, write_splits)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("out_dir", type=Path)
  ap.add_argument("--train", type=int, default=200000, help="train problems")
  ap.add_argument("--test", type=int, default=1000, help="test problems")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--test-seed", type=int, default=None,
                  help="seed of the test split (default: seed + 1)")
  ap.add_argument("--ood", type=int, default=0,
                  help="problems from held-out templates and names")
  ap.add_argument("--phrasing", choices=PHRASINGS, default=DEFAULT_PHRASING,
                  help="'varied' rewords steps at random (data/phrasing.py); "
                  "'fixed' writes them as the templates state them (the "
                  "first shipped model's corpus)")
  ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1),
                  help="processes drawing the train split (same problems "
                  "for any number)")
  args = ap.parse_args(argv)
  if min(args.train, args.test, args.ood) < 0:
    ap.error("--train, --test and --ood must be >= 0")
  if args.test_seed is not None and args.test_seed == args.seed:
    ap.error("--test-seed must differ from --seed")
  t0 = time.time()
  info = write_splits(args.out_dir, args.train, args.test, args.seed,
                      args.test_seed, args.ood, args.workers, args.phrasing)
  for split in ("train", "test", "ood"):
    path = args.out_dir / f"{split}.jsonl"
    rows = read_jsonl(path) if info[split] else []
    bad = [i for i, r in enumerate(rows) if not check_solution(r["answer"])]
    if bad:
      sys.exit(f"error: {len(bad)} {split} answers fail check_solution "
               f"(first: line {bad[0] + 1})")
  print(f"wrote {args.out_dir}: {info['train']} train, {info['test']} test, "
        f"{info['ood']} ood problems ({info['test_in_train_dropped']} test "
        f"questions found in train, replaced) (seeds {info['seed']}/{info['test_seed']}) in "
        f"{time.time() - t0:.1f}s")


if __name__ == "__main__":
  main()
