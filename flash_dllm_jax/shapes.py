"""The project's shape vocabulary.

Array names carry their shape as a suffix (``q_BxQxHxD``) and einsum strings
use the same lower-case letters, so a reader can check every contraction by
eye. Each letter has one meaning everywhere:

  Sequences and passes
  B  batch rows (decode slots)
  N  tokens of a whole sequence (prompt + generation: N = P + G)
  P  prompt tokens (left-padded to the longest prompt of the batch)
  G  generated positions (gen_length)
  L  positions of one decoding block (block_length)
  Q  query positions pushed through the model in one forward
  S  key slots of a KV cache (its preallocated length)
  R  rows whose vocabulary logits are computed (R <= Q)
  U  requests in a continuous-batching queue

  Strategy budgets
  W  window positions: the first masked positions a window strategy decodes
  T  tracked tokens: the most-attended tokens whose queries are recomputed
  A  the mask budget: masked positions a query budget takes (mask_num;
     Elastic-Cache's window is their first W, Flash-Cache's follow its own)
  C  verify candidates: window drafts the verify pass re-checks
  X  excluded cache slots, as a list of positions (-1 = none)
  I  in-query keys: the pass's own new keys, attended besides the cache
  Y  the keys one attention pass attends: the cache slots then the in-query
     keys (Y = S + I), or one tile of them inside a kernel

  Model
  E  model width (d_model)
  H  query heads
  K  key/value heads (GQA: H = K * J)
  J  query heads sharing one key/value head
  D  head dimension
  F  MLP hidden width
  V  vocabulary (embedding rows)
  O  output width of a linear layer (E, F, or H * D)
  M  rows of a 2-D operand that are not batch rows: a matmul's rows
     (B * Q flattened), a training set's rows
  Z  scale groups of an 8-bit weight along its input (1: one scale per
     output channel; E / 128 for groups of 128)

Digits name fixed sizes (``top2_BxGx2``, ``ref_1xNxV``); a digit after a
letter divides it (``freqs_BxQxD2``: D / 2 rotary frequencies); two letters
together multiply (``q_BxKxQJxD``: a KV head's Q * J query rows, GQA heads
folded into rows); the word ``split`` names an axis of key splits
(``lse_splitxBxKxQJ``: one partial per split of the keys), the word
``tile`` an axis of key tiles (``e_BxKxJxQxtilex64``: 64 keys a tile).
"""
