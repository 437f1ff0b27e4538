"""The project's shape vocabulary.

Array names carry their shape as a suffix (``q_BxQxHxD``) and einsum strings use
the same lower-case letters, so a reader can check every contraction by eye.

  B  batch rows
  N  tokens of a whole sequence (prompt + generation)
  P  prompt tokens (left-padded to the longest prompt of the batch)
  Q  query positions pushed through the model in one forward
  S  key slots of a KV cache (its preallocated length)
  R  rows whose vocabulary logits are computed (R <= Q)
  E  model width (d_model)
  H  query heads
  K  key/value heads (GQA: H = K * G)
  G  query heads sharing one key/value head
  D  head dimension
  F  MLP hidden width
  V  vocabulary (embedding rows)
  L  layers
"""
