"""Qwen2's Hugging Face tensor names (`model.layers.*`, q/k/v biases, an
untied head) -> ours: the table of the Qwen2-based families (Dream,
Fast-dLLM v2)."""

from flash_dllm_jax.convert.tables import (E, E_F, E_Q, F_E, KV, KV_E, Q, Q_E,
                                           V_E, rules)

TABLE = rules("", [
    ("model.embed_tokens.weight", "embed", "identity", V_E),
    ("lm_head.weight", "lm_head", "transpose", V_E),
    ("model.norm.weight", "final_norm/scale", "identity", E),
]) + rules("model.layers.{layer}.", [
    ("input_layernorm.weight", "layers_{layer}/attn_norm/scale", "identity",
     E),
    ("self_attn.q_proj.weight", "layers_{layer}/q_proj/kernel", "transpose",
     Q_E),
    ("self_attn.q_proj.bias", "layers_{layer}/q_proj/bias", "identity", Q),
    ("self_attn.k_proj.weight", "layers_{layer}/k_proj/kernel", "transpose",
     KV_E),
    ("self_attn.k_proj.bias", "layers_{layer}/k_proj/bias", "identity", KV),
    ("self_attn.v_proj.weight", "layers_{layer}/v_proj/kernel", "transpose",
     KV_E),
    ("self_attn.v_proj.bias", "layers_{layer}/v_proj/bias", "identity", KV),
    ("self_attn.o_proj.weight", "layers_{layer}/attn_out/kernel", "transpose",
     E_Q),
    ("post_attention_layernorm.weight", "layers_{layer}/mlp_norm/scale",
     "identity", E),
    ("mlp.gate_proj.weight", "layers_{layer}/gate_proj/kernel", "transpose",
     F_E),
    ("mlp.up_proj.weight", "layers_{layer}/up_proj/kernel", "transpose", F_E),
    ("mlp.down_proj.weight", "layers_{layer}/down_proj/kernel", "transpose",
     E_F),
])
