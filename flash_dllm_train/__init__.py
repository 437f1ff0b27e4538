"""Training the project's own small dLLM with LLaDA's masked-diffusion loss
(imports the inference package `flash_dllm_jax`, never the reverse).

  objective.py    the loss (t ~ U(eps, 1), 1/t-weighted masked CE)
  data.py         fixed-length SFT rows (prompt | solution, EOT, EOS pad)
  stream.py       fresh rows drawn by worker processes while training
  config.py       TrainConfig, AdamW + warmup/cosine
  train.py        the jitted donated step, the loop, resume
  run_log.py      OUT/metrics.jsonl and the loss plot
  checkpoints.py  resumable training checkpoints, the bf16 export
  evaluate.py     decode held-out problems and score them
"""
