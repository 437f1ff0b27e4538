"""Argument checks shared by the samplers."""


def check_fits(prompt_len: int, gen_length: int, max_seq_len: int,
               needs_prompt: str | None = None) -> None:
  """The padded prompt plus the generation must fit the model; needs_prompt
  names a sampler that reads position i's prediction from position i - 1 and
  so needs at least one prompt token."""
  if needs_prompt and prompt_len < 1:
    raise ValueError(f"{needs_prompt} needs a prompt of at least one token: "
                     "the prediction for position i is read from position i-1")
  if prompt_len + gen_length > max_seq_len:
    raise ValueError(f"prompt ({prompt_len}) + gen_length ({gen_length}) "
                     f"exceeds max_seq_len {max_seq_len}")
