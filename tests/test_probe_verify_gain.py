"""scripts/probe_verify_gain.py on the tiny checkpoint: main's summary and
records, the checks at 0 (and a planted error caught), verify's hook
restored, bad arguments refused. The random model's drafts are unsure, so
a low gamma is what makes verify accept some."""

import importlib.util
import json

import numpy as np
import pytest

from flash_dllm_jax.checkpoint import load
from flash_dllm_jax.sampling import flash_verify
from flash_dllm_jax.sampling.flash_dllm import FlashDLLMSampler
from tests.paths import ROOT, TINY_CHECKPOINT

_spec = importlib.util.spec_from_file_location(
    "probe_verify_gain", ROOT / "scripts" / "probe_verify_gain.py")
probe_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe_mod)


def _sane(records, ends, gen_length):
  for rec in records:
    assert 0 <= rec["useful_cand"] <= len(rec["cand"]) <= len(rec["window"])
    assert 0 <= rec["useful_kept"] <= rec["kept"] <= len(rec["cand"])
    assert rec["useful_kept"] <= rec["useful_cand"]
    assert 0 <= rec["useful_eps"] <= len(rec["eps"]) <= len(rec["window"])
    assert all(0 <= s < gen_length for s in rec["window"])
    assert set(rec["eps"]) <= set(rec["window"])
    assert set(rec["cand"]) <= set(rec["window"]) - set(rec["eps"])
    assert rec["conf"] == sorted(rec["conf"], reverse=True)
    assert len(rec["p"]) == len(rec["cum"]) == len(rec["cand"])
    assert rec["end"] == ends[rec["prob"]]


def test_main_summary_records_and_checks(tmp_path):
  out, recs = tmp_path / "s.json", tmp_path / "r.jsonl"
  s = probe_mod.main(["--checkpoint", str(TINY_CHECKPOINT), "--limit", "2",
                      "--gen-length", "32", "--block-m", "4", "--json",
                      str(out), "--records", str(recs)])
  assert flash_verify.verify.__name__ == "verify"  # the hook is gone
  assert json.loads(out.read_text()) == json.loads(json.dumps(s))
  assert s["mismatches"] == 0
  assert all(v == 0 for v in s["checks"].values()), s["checks"]
  for key in ("row_steps", "problems", "window_mean", "eps_mean",
              "cand_mean", "cand_useful_mean", "no_useful_cand_share",
              "kept_mean", "kept_useful_mean", "useful_tokens_eps",
              "useful_tokens_verify", "verify_share", "first_useful",
              "product_fails", "useful_cands", "tok_per_step", "seconds"):
    assert key in s, key
  assert s["problems"] == 2 and s["row_steps"] > 0
  assert 0 <= s["cand_useful_mean"] <= s["cand_mean"] <= 2  # block_m // 2
  assert 0 <= s["kept_useful_mean"] <= s["kept_mean"] <= s["cand_mean"]
  assert 0 <= s["no_useful_cand_share"] <= 1 and 0 <= s["verify_share"] <= 1
  assert s["first_useful"]["n"] == sum(s["first_useful"]["p_hist"])
  assert sum(s["product_fails"].values()) == s["first_useful"]["n"]
  tps = s["tok_per_step"]
  assert set(tps) == {"flash-cache", "flash-dllm"}
  for t in tps.values():
    assert 0 < t["steps"] <= 2 * 32 and 0 < t["tokens"] <= 2 * 32
    assert t["tok_per_step"] == pytest.approx(t["tokens"] / t["steps"])
  records = [json.loads(line) for line in recs.read_text().splitlines()]
  assert len(records) == s["row_steps"]
  ends = {r["prob"]: r["end"] for r in records}
  _sane(records, ends, 32)
  # Every answer token is committed once, by epsilon or by verify.
  assert s["useful_tokens_eps"] + s["useful_tokens_verify"] == sum(
      e + 1 for e in ends.values())


def test_accepting_verify_checks_at_zero_and_a_planted_error_caught():
  params, config, tok = load(TINY_CHECKPOINT)
  _, probs = probe_mod.load_problems(tok, ROOT / "data" / "synthetic_gsm", 2)
  rows, seeds = [tok.encode(p.prompt) for p in probs], [p.index for p in probs]
  sampler = FlashDLLMSampler(gen_length=32, block_m=4, verify=True,
                             gamma=0.05)
  records, ends, steps, answers, checks = probe_mod.probe_rows(
      params, config, rows, seeds, sampler, log=lambda s: None)
  assert checks == dict.fromkeys(probe_mod.CHECKS, 0)
  assert sum(r["kept"] for r in records) > 0  # verify did accept drafts
  _sane(records, ends, 32)
  assert set(steps) == set(seeds) and all(
      steps[i] == 1 + max(r["step"] for r in records if r["prob"] == i)
      for i in seeds)
  s = probe_mod.summarize(records, sampler.gamma)
  assert s["useful_tokens_verify"] > 0
  assert s["useful_tokens_eps"] + s["useful_tokens_verify"] == sum(
      len(a) for a in answers.values())
  # One candidate's keep flipped: the keep rule check counts it.
  c = sampler.block_m // 2
  x = dict(S_B=np.array([2]), p_BxC=np.array([[0.9, 0.5]], np.float32),
           keep_BxC=np.array([[True, True]]),
           window_BxW=np.array([[10, 11, 12, -1]]),
           conf_BxW=np.array([[0.95, 0.5, 0.7, 0.0]], np.float32),
           drafts_BxW=np.array([[7, 8, 9, 0]]),
           committed_BxW=np.array([[True, False, False, False]]),
           tokens_BxN=np.arange(16)[None] * 0 + 7)
  got = probe_mod.check_row(x, 0, np.array([12, 11]), np.array([9, 8]),
                            0.8, c)
  assert got["keep_rule"] == 1 and got["candidates"] == 0
  assert got["not_written"] == 2  # drafts 9 and 8 are not in the tokens
  got = probe_mod.check_row(x, 0, np.array([11, 12]), np.array([8, 9]),
                            0.8, c)
  assert got["candidates"] == 1  # not in confidence order


def test_bad_arguments_are_refused():
  for bad in (["--limit", "0"], ["--block-m", "1"], ["--gen-length", "0"]):
    with pytest.raises(SystemExit) as e:
      probe_mod.main(bad)
    assert e.value.code == 2
