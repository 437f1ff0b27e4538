"""LLaDA2.x's chat format (the Ling-2.0 tokenizer's roles): a system turn
that always carries the reasoning switch, then HUMAN / ASSISTANT turns,
each closed by <|role_end|>. A real checkpoint's tokenizer_config.json
brings its own template, which wins; this one renders the prompt form
inclusionAI's LLaDA2 examples send and is what tiny test tokenizers carry.
"""

CHAT_TEMPLATE = (
    "{%- set sys = messages[0]['content'] + '\\n' if messages and "
    "messages[0]['role'] == 'system' else '' -%}"
    "{{- '<role>SYSTEM</role>' + sys + 'detailed thinking off<|role_end|>' -}}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}"
    "{{- '<role>HUMAN</role>' + m['content'] + '<|role_end|>' -}}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{- '<role>ASSISTANT</role>' + m['content'] + '<|role_end|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}"
    "{%- endif -%}")
