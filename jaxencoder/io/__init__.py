"""Where runs live: paths (local or Cloud Storage), orbax checkpoints, the run directory."""
