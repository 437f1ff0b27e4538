"""LLaDA's Hugging Face tensor names (OLMo's `model.transformer.*`) -> ours."""

from flash_dllm_jax.convert.tables import E, E_F, E_Q, F_E, KV_E, Q_E, V_E, rules

TABLE = rules("model.transformer.", [
    ("wte.weight", "embed", "identity", V_E),
    ("ff_out.weight", "lm_head", "transpose", V_E),
    ("ln_f.weight", "final_norm/scale", "identity", E),
]) + rules("model.transformer.blocks.{layer}.", [
    ("attn_norm.weight", "layers_{layer}/attn_norm/scale", "identity", E),
    ("q_proj.weight", "layers_{layer}/q_proj/kernel", "transpose", Q_E),
    ("k_proj.weight", "layers_{layer}/k_proj/kernel", "transpose", KV_E),
    ("v_proj.weight", "layers_{layer}/v_proj/kernel", "transpose", KV_E),
    ("attn_out.weight", "layers_{layer}/attn_out/kernel", "transpose", E_Q),
    ("ff_norm.weight", "layers_{layer}/mlp_norm/scale", "identity", E),
    ("ff_proj.weight", "layers_{layer}/gate_proj/kernel", "transpose", F_E),
    ("up_proj.weight", "layers_{layer}/up_proj/kernel", "transpose", F_E),
    ("ff_out.weight", "layers_{layer}/down_proj/kernel", "transpose", E_F),
])
