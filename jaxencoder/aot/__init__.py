"""Ahead-of-time compiles for accelerators this host does not have (Cloud TPU slices through
libtpu's deviceless topologies; NVIDIA GPUs through XLA's GPU target description):
`jaxencoder-compile` / `python -m jaxencoder.aot`. See docs/performance.md."""
