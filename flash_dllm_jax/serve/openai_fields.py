"""The OpenAI / vLLM request fields beyond the sampler's own, and what the
server does with each:

- presence_penalty / frequency_penalty (0: off) and vLLM's
  repetition_penalty (1: off) are taken at their neutral values and refused
  otherwise. vLLM applies them to the logits of each next token from the
  tokens generated before it; a diffusion sampler commits several tokens
  per step in any order, and no sampler here reads a per-row token count
  inside its compiled loop, so a penalty would be silently ignored.
- message content as a list of parts: the text parts joined in order;
  other parts (images, audio) are refused, since no family served here
  takes them. The `developer` role is OpenAI's new name for `system` and is
  templated as one.
- several completions prompts: each its own row(s), answers in order,
  choice index = prompt index * n + choice.
- best_of: equal to n (or absent); more is refused, as vLLM's V1 engine
  does. suffix: refused (no family here fills in the middle). metadata:
  accepted, and ignored (OpenAI stores it; nothing here stores requests).
"""

from __future__ import annotations

from flash_dllm_jax.serve.errors import BadRequest
from flash_dllm_jax.serve.protocol import ChatRequest, CompletionRequest


def check(req, family: str) -> None:
  """BadRequest naming the first field the server cannot honour."""
  for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                        ("repetition_penalty", 1.0)):
    value = getattr(req, name)
    if value is not None and value != neutral:
      raise BadRequest(
          f"{name} {value}: penalties are not supported (only {neutral:g}, "
          "off): a diffusion sampler commits tokens in parallel in any "
          "order, and none here penalizes inside its compiled loop", name)
  if isinstance(req, CompletionRequest):
    if req.suffix is not None:
      raise BadRequest("suffix is not supported: no model served here "
                       "fills in text between a prompt and a suffix",
                       "suffix")
    if req.best_of is not None and req.best_of != req.n:
      raise BadRequest(f"best_of {req.best_of} with n {req.n}: best_of "
                       "must equal n (as in vLLM's V1 engine); ask for n "
                       "choices and rank them with logprobs", "best_of")
  if isinstance(req, ChatRequest):
    for i, m in enumerate(req.messages):
      if isinstance(m.content, str):
        continue
      for k, part in enumerate(m.content):
        param = f"messages.{i}.content.{k}"
        if part.type != "text":
          raise BadRequest(f"{param}: content of type {part.type!r} is not "
                           f"supported: the {family} family takes text "
                           "only", param)
        if part.text is None:
          raise BadRequest(f"{param}: a text part needs `text`", param)


def messages(req: ChatRequest) -> list[dict]:
  """The chat template's messages: text parts joined, `developer` as
  `system`."""
  out = []
  for m in req.messages:
    d = m.model_dump(exclude_none=True)
    if not isinstance(m.content, str):
      d["content"] = "".join(p.text for p in m.content)
    if d["role"] == "developer":
      d["role"] = "system"
    out.append(d)
  return out


def prompts(req: CompletionRequest) -> list:
  """The request's prompts: each a string or a list of token ids."""
  prompt = req.prompt
  if isinstance(prompt, list) and prompt and isinstance(prompt[0],
                                                        (str, list)):
    return list(prompt)
  return [prompt]
