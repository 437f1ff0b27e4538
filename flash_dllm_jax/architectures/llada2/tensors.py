"""LLaDA2.x's Hugging Face tensor names (inclusionAI's modeling_llada2_moe:
`model.layers.N.attention.*`, `mlp.experts.X.*`) -> ours. The fused
query_key_value rows [q heads | k heads | v heads] split into q/k/v; each
layer's experts stack into [X, ...] parameters."""

from flash_dllm_jax.convert.tables import (D, E, E_F, E_M, E_Q, E_S, F_E, M_E,
                                           QKV_E, QKV_SPLIT, S_E, V_E, X, X_E,
                                           Rule, rules)

_L = "layers_{layer}/"
_QKV = (_L + "q_proj/kernel", _L + "k_proj/kernel", _L + "v_proj/kernel")

TABLE = rules("model.", [
    ("word_embeddings.weight", "embed", "identity", V_E),
    ("norm.weight", "final_norm/scale", "identity", E),
]) + rules("", [("lm_head.weight", "lm_head", "transpose", V_E)]) + (
    Rule("model.layers.{layer}.attention.query_key_value.weight", _QKV,
         "transpose", QKV_E, split=QKV_SPLIT),
) + rules("model.layers.{layer}.", [
    ("input_layernorm.weight", _L + "attn_norm/scale", "identity", E),
    ("attention.query_layernorm.weight", _L + "q_norm/scale", "identity", D),
    ("attention.key_layernorm.weight", _L + "k_norm/scale", "identity", D),
    ("attention.dense.weight", _L + "attn_out/kernel", "transpose", E_Q),
    ("post_attention_layernorm.weight", _L + "mlp_norm/scale", "identity", E),
]) + rules("model.layers.{layer}.mlp.", [
    ("gate_proj.weight", _L + "gate_proj/kernel", "transpose", F_E),
    ("up_proj.weight", _L + "up_proj/kernel", "transpose", F_E),
    ("down_proj.weight", _L + "down_proj/kernel", "transpose", E_F),
], layers="dense") + rules("model.layers.{layer}.mlp.", [
    ("gate.weight", _L + "moe/router", "transpose", X_E),
    ("gate.expert_bias", _L + "moe/expert_bias", "identity", X),
    ("experts.{expert}.gate_proj.weight", _L + "moe/experts_gate/kernel",
     "transpose", M_E),
    ("experts.{expert}.up_proj.weight", _L + "moe/experts_up/kernel",
     "transpose", M_E),
    ("experts.{expert}.down_proj.weight", _L + "moe/experts_down/kernel",
     "transpose", E_M),
    ("shared_experts.gate_proj.weight", _L + "moe/shared/gate_proj/kernel",
     "transpose", S_E),
    ("shared_experts.up_proj.weight", _L + "moe/shared/up_proj/kernel",
     "transpose", S_E),
    ("shared_experts.down_proj.weight", _L + "moe/shared/down_proj/kernel",
     "transpose", E_S),
], layers="moe")
