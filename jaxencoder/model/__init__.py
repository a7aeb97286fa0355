"""The model: the encoder (`encoder`, `embeddings`, `attention` and its kernels in `flash`,
`ffn`, `positions`, `masks`, `pooling`), its architecture (`config`), the task heads
(`heads`), the decoder, ELECTRA, LoRA, and the model side of a run directory (parameter
layouts in `stack_layout`, restore targets in `restore_targets`). The public names are
importable from `jaxencoder` itself (`from jaxencoder import Encoder, EncoderConfig`)."""
