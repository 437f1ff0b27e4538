"""Training on fresh rows drawn while it runs (flash_dllm_train/stream.py),
and resuming: a paused and resumed run equals an uninterrupted one bit for
bit, from stored rows and from the stream, in the library and through
scripts/train_tiny.py."""

import dataclasses
import json

import jax
import numpy as np
import pytest

import flash_dllm_jax as fdj
from flash_dllm_data import synthetic_gsm as sg
from flash_dllm_jax.tokenizer import Tokenizer
from flash_dllm_train import checkpoints as ckpt
from flash_dllm_train.config import TrainConfig, make_optimizer
from flash_dllm_train.data import encode_problems, pad_lengths, rows_batch
from flash_dllm_train.train import train
from tests.training_setup import setup  # noqa: F401 (a fixture)


def test_row_encoder_reproduces_the_tokenizer():
  """RowEncoder (cached pieces between digits, the chat template rendered
  once) gives encode_problems' rows, on the train, test and unseen-name ood
  splits, and the tokenizer's ids on text with odd whitespace."""
  from flash_dllm_train.stream import RowEncoder
  from tests.paths import ROOT
  tok = Tokenizer.from_dir(ROOT / "checkpoints" / "synthetic-gsm-llada-16m")
  enc = RowEncoder(tok)
  for split in sg.SPLITS:
    problems = sg.generate(300, 3, split)
    rows = encode_problems(problems, tok, 400)
    for i, p in enumerate(problems):
      ids, prompt_len = enc.row(p, i)
      assert prompt_len == rows.prompt_len_M[i]
      assert ids == rows.tokens_MxN[i, :rows.min_len_M[i] - 1].tolist()
    enc.check(problems[1], 1)
  for text in ("a  1", "x \n 2 y", "  3", "$5.", "it's 4", "1\n\n2", "end  ",
               "Q: 7?\nA:", "5 ", "h\u00e9llo 9 w\u00f6rld", "a\t\t8", ""):
    assert enc.encode(text) == tok.encode(text), text


def test_stream_batches_are_fresh_deterministic_and_held_out(setup):
  """Batch s holds problems s*B..s*B+B-1 of the train stream, tokenized as
  encode_problems does, with Batches' EOS padding draws; a held-out
  question is replaced by another draw; worker processes give the same
  batches as the calling process, in order or after a jump."""
  from flash_dllm_train.stream import StreamBatches
  tok = setup[0]
  problems = [sg.draw("train", 4, i) for i in range(24)]
  want = encode_problems(problems, tok, 400)  # index i alternates the turn
  plain = StreamBatches(tok, 400, 8, seed=1, data_seed=4)
  for step in (0, 2):
    got = plain(step)
    ref = rows_batch(want, np.arange(8 * step, 8 * step + 8),
                     pad_lengths(want.min_len_M[8 * step:8 * step + 8], 400,
                                 1, step, "random"))
    for k in got:
      np.testing.assert_array_equal(got[k], ref[k])
  exclude = [problems[9]["question"], "not a question of the stream"]
  local = StreamBatches(tok, 400, 8, seed=1, data_seed=4, exclude=exclude)
  b1 = local(1)
  assert local.replaced_held_out == 1
  np.testing.assert_array_equal(b1["tokens_BxN"][0], want.tokens_MxN[8])
  np.testing.assert_array_equal(b1["tokens_BxN"][2:], want.tokens_MxN[10:16])
  replaced = tok.decode(b1["tokens_BxN"][1], skip_special_tokens=False)
  assert problems[9]["question"] not in replaced
  assert sg.draw("train", 4, 9, 1)["question"] in replaced
  with StreamBatches(tok, 400, 8, seed=1, data_seed=4, exclude=exclude,
                     workers=1, prefetch=3) as pooled:
    pooled.start(1)
    for step in (1, 2, 3, 7, 2):  # in order, a jump ahead, one back
      a, b = pooled(step), local(step)
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
  with pytest.raises(ValueError, match="batch size, seed and eos_pad"):
    train(setup[1], tok, plain, "/nonexistent", TrainConfig(batch_size=4))


@pytest.mark.parametrize("source", ["rows", "stream"])
def test_resume_is_bitwise(setup, tmp_path, source):
  """N steps straight and N/2 + N/2 in two invocations (the second resumed
  from the first's checkpoint) end with the same float32 params and
  optimizer state, bit for bit (one device)."""
  from flash_dllm_train.stream import StreamBatches
  tok, config, rows, _ = setup
  tc = TrainConfig(steps=6, batch_size=4, warmup_steps=2, log_every=1,
                   eval_every=100, ckpt_every=100)

  def data():
    if source == "rows":
      return rows
    # the stored rows' width: both sources run one compiled train step
    return StreamBatches(tok, rows.tokens_MxN.shape[1], 4, seed=0,
                         data_seed=2)

  straight, step = train(config, tok, data(), tmp_path / "a", tc,
                         log=lambda s: None)
  assert step == 6
  half = dataclasses.replace(tc, stop_after_steps=3)
  _, step = train(config, tok, data(), tmp_path / "b", half,
                  log=lambda s: None)
  assert step == 3 and [s for s, _ in ckpt.list_checkpoints(
      tmp_path / "b")] == [3]
  resumed, step = train(config, tok, data(), tmp_path / "b", half,
                        log=lambda s: None)
  assert step == 6
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  like = make_optimizer(tc).init(straight)
  states = [ckpt.restore_checkpoint(ckpt.list_checkpoints(tmp_path / d)[-1][1],
                                    like) for d in ("a", "b")]
  assert states[0][0] == states[1][0] == 6
  for a, b in zip(jax.tree.leaves(states[0][2]), jax.tree.leaves(states[1][2])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  log = [json.loads(line) for line in
         (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
  ref = [json.loads(line) for line in
         (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
  drop = ("ms_per_step",)
  assert [{k: v for k, v in r.items() if k not in drop} for r in log] == \
      [{k: v for k, v in r.items() if k not in drop} for r in ref]


def test_train_tiny_script_streams_and_resumes_exactly(tmp_path, capsys):
  """train_tiny --stream: a run paused by --stop-after-steps and rerun
  ends where the uninterrupted run ends (its last float32 checkpoint)."""
  import importlib.util
  from tests.paths import ROOT
  spec = importlib.util.spec_from_file_location(
      "train_tiny", ROOT / "scripts" / "train_tiny.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  base = ["--smoke", "--stream", "--stream-workers", "1", "--eval-problems",
          "0", "--seq-len", "256"]
  script.main(base + ["--out", str(tmp_path / "a")])
  assert "fresh problems (stream seed 0" in capsys.readouterr().out
  script.main(base + ["--out", str(tmp_path / "b"), "--stop-after-steps",
                      "3"])
  assert "paused at step 3 of 6" in capsys.readouterr().out
  script.main(base + ["--out", str(tmp_path / "b"), "--stop-after-steps",
                      "3"])
  assert "resuming" in capsys.readouterr().out
  a, b = (fdj.load(ckpt.checkpoint_dir(tmp_path / d, 6) / "model")[0]
          for d in ("a", "b"))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
