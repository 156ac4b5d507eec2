"""The encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017), in Linen.

  embeddings.py   token embeddings (scaled by sqrt(d_model)), positions, linear projections
  attention.py    masks, scaled dot-product attention, multi-head attention with its cache
  transformer.py  feed-forward, residual blocks, encoder/decoder layers and the whole model

Shape suffixes used in names (one letter per axis):
  B batch, S source length, T target length (or query length), D d_model, H heads,
  K head dim (d_model // num_heads), F feed-forward width, V vocabulary.
Parameters carry logical axis names (embed, heads, kv, mlp, vocab) that the rules in
`config.parallelism.axis_rules` map onto mesh axes (`parallel/mesh.py`).

Numerics: with `dtype="bfloat16"`, matmul inputs are cast to bf16 and accumulated in f32, while
the residual stream, LayerNorm and softmax stay f32; `dtype="float32"` is the exact reference
path. The matmuls' backward rules and the dropout generator live in `transformer_jax/ops`.
"""
