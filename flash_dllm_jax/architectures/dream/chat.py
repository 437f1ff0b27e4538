"""Dream-v0-Instruct-7B's chat template: Qwen2.5's (qwen2_chat.py), the
`chat_template` of its genuine tokenizer_config.json."""

from flash_dllm_jax.architectures.qwen2_chat import CHAT_TEMPLATE

__all__ = ["CHAT_TEMPLATE"]
