"""Tasks: one module per family (masked_lm, replaced_tokens, classification, regression,
span, contrastive, seq2seq), each owning its model, loss, metrics, options, input
pipeline, batch shapes and predictions (base.Family); registry.py maps task names to
them."""
