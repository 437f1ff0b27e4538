"""OpenAI-compatible serving with online continuous batching."""

MAX_BODY_BYTES = 4 << 20  # the largest request body read (--max-body-bytes)
