"""Training the project's own small dLLMs (LLaDA, LLaDA2, DiffusionGemma formats)
(imports the inference package `flash_dllm_jax`, never the reverse).

  objective.py    the loss (t ~ U(eps, 1), 1/t-weighted masked CE)
  block_objective.py  LLaDA2's block diffusion (two copies of a row)
  canvas_objective.py DiffusionGemma's SFT objective (uniform noise, a
                  canvas against the causal cache, self-conditioning)
  models.py       each architecture's config, init and checkpoint format
  data.py         fixed-length SFT rows (prompt | solution, EOT, EOS pad)
  stream.py       fresh rows drawn by worker processes while training
  config.py       TrainConfig, AdamW + warmup/cosine
  train.py        the jitted donated step, the loop, resume
  run_log.py      OUT/metrics.jsonl and the loss plot
  checkpoints.py  resumable training checkpoints, the bf16 export
  evaluate.py     decode held-out problems and score them
"""
