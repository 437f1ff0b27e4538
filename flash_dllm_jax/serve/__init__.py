"""OpenAI-compatible serving with online continuous batching."""

MAX_BODY_BYTES = 4 << 20  # the largest request body read (--max-body-bytes)
# alternatives per token a request may ask for (OpenAI's limit; the
# default of --max-logprobs, vLLM's flag)
MAX_LOGPROBS = 20
