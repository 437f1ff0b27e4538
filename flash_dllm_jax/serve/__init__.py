"""OpenAI-compatible serving with online continuous batching."""
