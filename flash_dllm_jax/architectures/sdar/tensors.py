"""SDAR's Hugging Face tensor names (Qwen3's `model.layers.*`, QK-norm, no
biases; SDAR-30B-A3B's MoE layers Qwen3-MoE's `mlp.gate` router and
`mlp.experts.X.*`) -> ours. Each layer's experts stack into [X, ...]
parameters."""

from flash_dllm_jax.convert.tables import (D, E, E_F, E_M, E_Q, F_E, KV_E,
                                           M_E, Q_E, V_E, X_E, rules)

_L = "layers_{layer}/"

TABLE = rules("", [
    ("model.embed_tokens.weight", "embed", "identity", V_E),
    ("lm_head.weight", "lm_head", "transpose", V_E),
    ("model.norm.weight", "final_norm/scale", "identity", E),
]) + rules("model.layers.{layer}.", [
    ("input_layernorm.weight", _L + "attn_norm/scale", "identity", E),
    ("self_attn.q_proj.weight", _L + "q_proj/kernel", "transpose", Q_E),
    ("self_attn.k_proj.weight", _L + "k_proj/kernel", "transpose", KV_E),
    ("self_attn.v_proj.weight", _L + "v_proj/kernel", "transpose", KV_E),
    ("self_attn.q_norm.weight", _L + "q_norm/scale", "identity", D),
    ("self_attn.k_norm.weight", _L + "k_norm/scale", "identity", D),
    ("self_attn.o_proj.weight", _L + "attn_out/kernel", "transpose", E_Q),
    ("post_attention_layernorm.weight", _L + "mlp_norm/scale", "identity", E),
]) + rules("model.layers.{layer}.mlp.", [
    ("gate_proj.weight", _L + "gate_proj/kernel", "transpose", F_E),
    ("up_proj.weight", _L + "up_proj/kernel", "transpose", F_E),
    ("down_proj.weight", _L + "down_proj/kernel", "transpose", E_F),
], layers="dense") + rules("model.layers.{layer}.mlp.", [
    ("gate.weight", _L + "moe/router", "transpose", X_E),
    ("experts.{expert}.gate_proj.weight", _L + "moe/experts_gate/kernel",
     "transpose", M_E),
    ("experts.{expert}.up_proj.weight", _L + "moe/experts_up/kernel",
     "transpose", M_E),
    ("experts.{expert}.down_proj.weight", _L + "moe/experts_down/kernel",
     "transpose", E_M),
], layers="moe")
