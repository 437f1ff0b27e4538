"""Gemma 4's chat format (the format gemma/gm/data/_tasks.py and the
diffusion examples render): each turn `<|turn>ROLE\\n...<turn|>\\n`, the
assistant's role named `model`, the prompt ending with `<|turn>model\\n`,
BOS first. (Gemma 2/3 used <start_of_turn>/<end_of_turn>; Gemma 4's
tokenizer names ids 105/106 <|turn> and <turn|>.) A real tokenizer's own
template wins; this one is what tiny test tokenizers carry."""

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{- '<|turn>' + role + '\\n' + m['content'] + '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}")
