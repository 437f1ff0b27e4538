"""What the server tests share: a real `python -m flash_dllm_jax serve`
process on a free localhost port, the tiny model's options, offline answers
to compare with, and raw SSE and burst clients (httpx)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from flash_dllm_jax import generate
from flash_dllm_jax.generate import answer_ids
from tests.paths import ROOT

TINY_OPTIONS = {"gen_length": 16, "block_m": 8}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Server:
  """A `python -m flash_dllm_jax serve` process and its URL (strategy
None: the server's default). It starts with `--max-logprobs 0` (no
alternatives' program to compile) unless the flags set it.

  The port is a free one picked just before the start; when another process
  takes it in between (tests run in parallel), the server starts again on
  another."""

  def __init__(self, checkpoint, strategy: str, options: dict, *flags: str,
               log_path=None, ready_timeout: float = 600.0,
               env: dict | None = None):
    self.args = [sys.executable, "-m", "flash_dllm_jax", "serve",
                 "--checkpoint", str(checkpoint), "--host", "127.0.0.1",
                 *(["--strategy", strategy] if strategy else []), *flags]
    if "--max-logprobs" not in flags:
      self.args += ["--max-logprobs", "0"]
    for k, v in options.items():
      self.args += ["--" + k.replace("_", "-"), str(v)]
    self.env = {**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": "highest",
                "JAX_PLATFORMS": "cpu", **(env or {})}
    if log_path is None:
      fd, log_path = tempfile.mkstemp(prefix="serve-", suffix=".log")
      os.close(fd)
    self.log_path = log_path
    self.deadline = time.monotonic() + ready_timeout
    self.start()

  def start(self):
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.log = open(self.log_path, "w")
    self.proc = subprocess.Popen(self.args + ["--port", str(self.port)],
                                 cwd=ROOT, env=self.env, stdout=self.log,
                                 stderr=subprocess.STDOUT)

  def wait_ready(self, attempts: int = 3) -> dict:
    while time.monotonic() < self.deadline:
      if self.proc.poll() is not None:
        self.log.close()
        log = open(self.log_path).read()
        if attempts > 1 and "address already in use" in log.lower():
          attempts -= 1
          self.start()
          continue
        raise RuntimeError(f"server exited with {self.proc.returncode}:\n"
                           f"{log[-3000:]}")
      try:
        r = httpx.get(self.url + "/health", timeout=5)
        if r.status_code == 200:
          return r.json()
        assert r.json()["status"] == "starting"
      except httpx.TransportError:
        pass
      time.sleep(0.5)
    raise TimeoutError("the server did not become ready")

  def client(self) -> openai.OpenAI:
    return openai.OpenAI(base_url=self.url + "/v1", api_key="unused",
                         max_retries=0, timeout=300)

  def metrics(self) -> dict:
    text = httpx.get(self.url + "/metrics").text
    return {s.name: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if not s.labels} | {
        f"{s.name}{{{','.join(f'{k}={v}' for k, v in s.labels.items())}}}":
        s.value for fam in text_string_to_metric_families(text)
        for s in fam.samples if s.labels}

  def close(self):
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    self.log.close()


def offline(model, sampler, rows, seeds, max_tokens):
  """The answers' token ids from offline generate."""
  out = generate(model, rows, sampler=sampler, seed=seeds)
  config = model[1]
  return [answer_ids(g, config)[:m] for g, m in zip(out.tokens_BxG,
                                                    max_tokens)]


def check_answers_equal_offline(checkpoint, strategy: str, options: dict,
                                offline_ids, prompt: str, log_path,
                                *flags: str) -> None:
  """The server on a block family's checkpoint, with the official client:
  a completion and a chat answer (greedy) equal offline generate's token
  ids, `offline_ids(prompt, chat)`."""
  server = Server(checkpoint, strategy, options, "--batch-size", "2",
                  "--max-prompt-tokens", "96", *flags, log_path=log_path)
  try:
    assert server.wait_ready()["strategy"] == strategy
    client = server.client()
    name = client.models.list().data[0].id
    got = client.completions.create(model=name, prompt=prompt, max_tokens=16,
                                    temperature=0)
    assert got.choices[0].token_ids == offline_ids(prompt, chat=False)
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": prompt}],
        temperature=0)
    assert chat.choices[0].token_ids == offline_ids(prompt, chat=True)
  finally:
    server.close()


def stream_raw(url, body, ids=None) -> list[str]:
  """The content deltas of one SSE stream, read with httpx (the chunks'
  token ids are appended to `ids`)."""
  deltas = []
  with httpx.stream("POST", url + "/v1/completions", json=body,
                    timeout=300) as r:
    assert r.status_code == 200
    lines = [line for line in r.iter_lines() if line]
  assert lines[-1] == "data: [DONE]"
  for line in lines[:-1]:
    obj = json.loads(line.removeprefix("data: "))
    if obj["choices"]:
      deltas.append(obj["choices"][0]["text"])
      if ids is not None:
        ids += obj["choices"][0]["token_ids"]
  return deltas


async def burst(url, n, body):
  async with httpx.AsyncClient(timeout=300) as client:
    return await asyncio.gather(*(client.post(url + "/v1/completions",
                                              json=body) for _ in range(n)))

