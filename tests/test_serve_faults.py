"""The server's guards, on a real process on localhost: the API key (from
$FLASH_DLLM_JAX_API_KEY), the body size limit, malformed bodies, the
request-header timeout, tokenizing off the event loop, and SIGTERM past
--shutdown-timeout (last: it stops the module's server). Raw sockets and
httpx send what the `openai` client never would."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import signal
import socket

import httpx
import openai
import pytest

from flash_dllm_jax.serve.security import ShutdownAnswers, is_loopback
from tests.entry_case import refusals
from tests.paths import TINY_CHECKPOINT
from tests.serve_case import TINY_OPTIONS, Server

pytestmark = pytest.mark.slow  # one server start (compilation) per module

KEY = "test-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "tiny-random-llada"
LIMIT = 2_000_000  # --max-body-bytes
HEADER_TIMEOUT = 1.0  # --header-timeout
SLACK = 30.0  # what a socket waits beyond HEADER_TIMEOUT before failing


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  # The same engines as test_serve_openai.py's and test_serve_hostile.py's
  # servers: compiled once per run.
  srv = Server(TINY_CHECKPOINT, "flash-dllm", TINY_OPTIONS,
               "--batch-size", "4", "--max-prompt-tokens", "64",
               "--steps-per-call", "2", "--max-body-bytes", str(LIMIT),
               "--header-timeout", str(HEADER_TIMEOUT),
               "--shutdown-timeout", "0",
               log_path=tmp_path_factory.mktemp("serve") / "server.log",
               env={"FLASH_DLLM_JAX_API_KEY": KEY})
  try:
    srv.wait_ready()
    yield srv
  finally:
    srv.close()


def _post(server, body: bytes, path="/v1/completions") -> httpx.Response:
  return httpx.post(server.url + path, content=body, timeout=60,
                    headers={**AUTH, "content-type": "application/json"})


def _raw(server, data: bytes = b"", sock=None) -> bytes:
  """Sends `data` and reads until the server closes the connection."""
  sock = sock or socket.create_connection(("127.0.0.1", server.port))
  with sock:
    sock.settimeout(HEADER_TIMEOUT + SLACK)
    sock.sendall(data)
    chunks = []
    while chunk := sock.recv(1 << 16):
      chunks.append(chunk)
  return b"".join(chunks)


def _json_of(response: bytes) -> dict:
  return json.loads(response.partition(b"\r\n\r\n")[2])


def test_api_key_guards_the_v1_routes(server):
  right = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY,
                        max_retries=0, timeout=300)
  c = right.completions.create(model=MODEL, prompt="2 + 3 =", max_tokens=4)
  assert c.usage.completion_tokens == 4
  wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope",
                        max_retries=0, timeout=60)
  for call in (lambda: wrong.models.list(),
               lambda: wrong.completions.create(model=MODEL, prompt="x")):
    with pytest.raises(openai.AuthenticationError) as e:
      call()
    assert e.value.status_code == 401
    assert e.value.body["code"] == "invalid_api_key"
  for headers in ({}, {"Authorization": KEY},
                  {"Authorization": f"Basic {KEY}"}):
    r = httpx.get(server.url + "/v1/models", headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == \
        "Bearer", (headers, r.text)
    assert r.json()["error"]["type"] == "invalid_request_error"
  assert "Authorization: Bearer" in httpx.get(
      server.url + "/v1/models").json()["error"]["message"]
  assert httpx.get(server.url + "/health").status_code == 200
  assert httpx.get(server.url + "/metrics").status_code == 200


def test_bodies_over_the_limit_get_413(server):
  head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
          b"Authorization: Bearer " + KEY.encode() + b"\r\n")
  # by Content-Length, before any of the body is sent
  reply = _raw(server, head + b"Content-Length: %d\r\n\r\n" % (LIMIT + 1))
  assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
  assert _json_of(reply)["error"]["code"] == "body_too_large"
  # chunked: once the bytes read pass the limit (the last chunk unfinished)
  data = b"x" * (LIMIT + 1)
  reply = _raw(server, head + b"Transfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(data) + data)
  assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
  assert str(LIMIT) in _json_of(reply)["error"]["message"]


def test_malformed_bodies_get_400_naming_the_field_and_reason(server):
  ok = {"model": MODEL, "prompt": "hi"}
  cases = [
      (b'{"model": "%s", "prompt": "a\xff\xfeb"}' % MODEL.encode(), "prompt",
       "not valid UTF-8 (byte 0xff)"),
      (b'{"model": \xff}', "body", "not valid UTF-8"),
      (json.dumps({**ok, "prompt": "a\ud800b"}).encode(), "prompt",
       "lone surrogate U+D800"),
      (json.dumps({**ok, "stop": ["x", "\udfff"]}).encode(), "stop.1",
       "lone surrogate U+DFFF"),
      (json.dumps({**ok, "temperature": float("nan")}).encode(),
       "temperature", "NaN is not a number"),
      (json.dumps({**ok, "decoding": {"threshold": float("inf")}}).encode(),
       "decoding.threshold", "Infinity is not a number"),
      (json.dumps({**ok, "seed": -float("inf")}).encode(), "seed",
       "-Infinity is not a number"),
      (json.dumps(ok)[:-1].encode() + b', "timeout": 1e999}', "timeout",
       "overflows a float"),
      (json.dumps(ok)[:-1].encode() + b', "seed": 1%s}' % (b"0" * 5000),
       "body", "digits"),
      (b"[1, 2]", "body", "must be a JSON object, got an array"),
      (b'"hi"', "body", "must be a JSON object, got a string"),
      (b"null", "body", "must be a JSON object, got null"),
      (b"[" * 100_000 + b"]" * 100_000, "body", "recursion"),
  ]
  for body, param, needle in cases:
    r = _post(server, body)
    assert r.status_code == 400, (body[:80], r.text)
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"], (
        body[:80], error)
  chat = {"model": MODEL,
          "messages": [{"role": "user", "content": "hi \ud83d"}]}
  r = _post(server, json.dumps(chat).encode(), "/v1/chat/completions")
  assert r.status_code == 400 and r.json()["error"]["param"] == \
      "messages.0.content"
  assert "lone surrogate U+D83D" in r.json()["error"]["message"]
  r = _post(server, json.dumps(ok).encode())  # the server is unharmed
  assert r.status_code == 200 and r.json()["choices"][0]["token_ids"]


def test_incomplete_headers_time_out(server):
  silent = _raw(server)  # connects, sends nothing
  partial = _raw(server, b"GET /health HT")
  kept = socket.create_connection(("127.0.0.1", server.port))
  kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
  first = b""
  while b"\r\n\r\n" not in first:
    first += kept.recv(1 << 16)
  head, _, got = first.partition(b"\r\n\r\n")
  assert head.startswith(b"HTTP/1.1 200 "), head
  length = int(head.lower().partition(b"content-length: ")[2].split()[0])
  while len(got) < length:
    got += kept.recv(1 << 16)
  second = _raw(server, b"GET /hea", sock=kept)  # the next, never finished
  assert silent == b""
  assert partial.startswith(b"HTTP/1.1 408 "), partial
  assert second.startswith(b"HTTP/1.1 408 "), second
  assert httpx.get(server.url + "/health").status_code == 200


def test_tokenizing_leaves_the_event_loop_free(server):
  """A long text prompt (allowed by size, far over the token limit) is
  tokenized in a worker thread: /health is answered while it runs (the
  gauge of requests being tokenized reads 1 before and after)."""
  body = json.dumps({"model": MODEL,
                     "prompt": "hello world 123 " * 110_000}).encode()
  assert len(body) <= LIMIT

  def preparing():
    return server.metrics()["dllm_preparing_requests"]

  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    big = pool.submit(_post, server, body)
    seen = []
    while not big.done():
      before = preparing()
      health = httpx.get(server.url + "/health", timeout=60).status_code
      seen.append((before, health, preparing()))
    r = big.result()
  assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
  assert "this server takes at most 64" in r.json()["error"]["message"]
  assert (1, 200, 1) in seen, seen


def test_bad_flags_exit_with_one_error():
  """Bad serve flags, --variant and --mesh included, each exit 1 with one
  error before anything compiles (all in one Python)."""
  variant = ["--strategy", "flash-dllm"]
  cases = [(["--api-key", " "], "the API key (--api-key or "
            "$FLASH_DLLM_JAX_API_KEY) is empty"),
           (["--header-timeout", "0"], "--header-timeout must be a finite "
            "number > 0"),
           (["--request-timeout", "nan"], "--request-timeout must be a "
            "finite number > 0, got nan"),
           (["--max-prompt-tokens", "100000"], "exceeds max_seq_len"),
           (["--strategy", "flash-cache", "--gamma", "0.5"], "option(s) "
            "--gamma do not apply to strategy 'flash-cache'"),
           ([*variant, "--variant", "threshold=0.9"], "same options"),
           ([*variant, "--variant", "threshold=0.7,gamma=0.5"],
            "gamma, threshold is a per-request setting (decoding.gamma, "
            "decoding.threshold)"),
           ([*variant, "--variant", "nope=1"],
            "unknown sampler option 'nope'"),
           ([*variant, "--mesh", "data=3"], "asks for 3 devices"),
           ([*variant, "--attention-split-target", "0"],
            "--attention-split-target: split_target must be an int >= 1"),
           ([*variant, "--strategy", "llada", "--variant", "temperature=0.7"],
            "temperature is a per-request")]
  got = refusals([["serve", "--checkpoint", str(TINY_CHECKPOINT), *flags]
                  for flags, _ in cases])
  for (flags, needle), (code, err) in zip(cases, got):
    assert code == 1 and needle in err, (flags, err)
    assert "Traceback" not in err


def test_loopback_hosts():
  assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "localhost"]))
  assert not any(map(is_loopback, ["0.0.0.0", "::", "10.1.2.3",
                                   "example.org"]))


def test_requests_cancelled_at_shutdown_get_server_shutdown():
  """uvicorn cancels what is still running when its graceful shutdown
  ends; the middleware answers 503 server_shutdown in place of a 500 (a
  stream that has begun: its error event and [DONE])."""

  async def waits(scope, receive, send):
    await asyncio.Event().wait()

  async def streams(scope, receive, send):
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    await asyncio.Event().wait()

  async def cut(app) -> list[dict]:
    sent = []

    async def record(message):
      sent.append(message)

    task = asyncio.ensure_future(ShutdownAnswers(app)(
        {"type": "http", "method": "POST", "path": "/v1/completions"},
        None, record))
    await asyncio.sleep(0)
    task.cancel()
    await task  # answered, not cancelled
    return sent

  start, body = asyncio.run(cut(waits))
  assert start["status"] == 503
  assert json.loads(body["body"])["error"]["code"] == "server_shutdown"
  _, end = asyncio.run(cut(streams))
  event, done = end["body"].decode().strip().split("\n\n")
  assert json.loads(event.removeprefix("data: "))["error"]["code"] == \
      "server_shutdown"
  assert done == "data: [DONE]" and not end.get("more_body")


def test_sigterm_past_the_timeout_answers_503(server):
  """Last: stops the module's server (--shutdown-timeout 0). Whatever is
  not finished gets 503 server_shutdown (a stream: its error event), and
  the log holds no traceback."""
  body = {"model": MODEL, "prompt": "term"}

  async def stream(client):
    async with client.stream("POST", server.url + "/v1/completions",
                             json={**body, "stream": True}) as r:
      return r.status_code, [x async for x in r.aiter_lines() if x]

  async def burst():
    async with httpx.AsyncClient(timeout=300, headers=AUTH) as client:
      whole = [client.post(server.url + "/v1/completions", json=body)
               for _ in range(48)]
      return await asyncio.gather(*whole, stream(client), stream(client))

  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    background = pool.submit(asyncio.run, burst())
    for _ in range(500):
      if server.metrics()["dllm_queue_length"] >= 30:
        break
    else:
      pytest.fail("the burst never queued")
    server.proc.send_signal(signal.SIGTERM)
    *replies, s1, s2 = background.result()
  codes = [r.status_code for r in replies]
  assert set(codes) <= {200, 503} and 503 in codes, codes
  for r in replies:
    if r.status_code == 503:
      assert r.json()["error"]["code"] == "server_shutdown"
      assert r.json()["error"]["type"] == "server_error"
  for status, lines in (s1, s2):
    if status == 503:  # it arrived after the SIGTERM: refused whole
      assert json.loads(lines[0])["error"]["code"] == "server_shutdown"
      continue
    assert status == 200 and lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2].removeprefix("data: "))
    assert "usage" in last or last["error"]["code"] == "server_shutdown"
  assert server.proc.wait(timeout=60) == 0
  log = open(server.log_path).read()
  for needle in ("Traceback", "CancelledError", '" 500 '):
    assert needle not in log, log[-3000:]
