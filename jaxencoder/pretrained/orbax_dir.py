"""jaxencoder checkpoint directories that `train.py --config.init_from=DIR` reads.

Layout written by `write`:  DIR/checkpoints/0/{state, config}  (orbax; state =
{"params": {"encoder": ..., ["mlm_head": ...]}}, config = {"model": EncoderConfig
fields}) plus DIR/tokenizer.json and DIR/vocab.txt when a tokenizer is given.
`read` accepts that, a training workdir (DIR/checkpoints from train.py) or the
checkpoints directory itself; it takes the latest step.
"""

from __future__ import annotations

import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from jaxencoder.io.checkpoint import CONFIG, STATE, Checkpointer, restore_params_only
from jaxencoder.config import EncoderConfig
from jaxencoder.heads import EncoderForMaskedLM
from jaxencoder.pretrained.hf_checkpoint import Params, read_tokenizer
from jaxencoder.tokenizer import Tokenizer


def write(directory, cfg: EncoderConfig, params: Params,
          tokenizer: Tokenizer | None = None) -> pathlib.Path:
  """Saves params (Encoder or {"encoder", "mlm_head"}) as step 0 of DIR/checkpoints."""
  directory = pathlib.Path(directory)
  checkpoints = directory / "checkpoints"
  if checkpoints.exists() and any(checkpoints.iterdir()):
    raise FileExistsError(f"{checkpoints}: not empty; choose a new --to directory")
  params = nn.meta.unbox(params)
  state = {"params": params if "encoder" in params else {"encoder": params}}
  with Checkpointer(checkpoints, save_interval_steps=1, max_to_keep=None,
                    async_save=False) as ckpt:
    ckpt.save(0, state, config={"model": cfg.to_dict()}, force=True)
    ckpt.wait()
  if tokenizer is not None:
    tokenizer.save(directory)
  return directory


def read(directory) -> tuple[EncoderConfig, Params, Tokenizer | None]:
  """(EncoderConfig, params, tokenizer) of the latest step; params as `write` takes them."""
  directory = pathlib.Path(directory)
  checkpoints = directory / "checkpoints" if (directory / "checkpoints").is_dir() else directory
  model_fields, saved_params = _saved_model_and_param_names(checkpoints)
  cfg = EncoderConfig.from_dict(model_fields)
  abstract = abstract_params(cfg)
  params = restore_params_only(checkpoints, abstract["encoder"])
  if "mlm_head" in saved_params:
    head = restore_params_only(checkpoints, abstract["mlm_head"], subtree=("params", "mlm_head"))
    params = {"encoder": params, "mlm_head": head}
  return cfg, params, read_tokenizer(directory)


def _saved_model_and_param_names(checkpoints: pathlib.Path) -> tuple[dict, set[str]]:
  """The checkpoint's model config fields and the top-level names under state/params."""
  if not checkpoints.is_dir():
    raise FileNotFoundError(f"{checkpoints}: no such checkpoint directory")
  manager = ocp.CheckpointManager(
      checkpoints.absolute(), options=ocp.CheckpointManagerOptions(read_only=True),
      item_handlers={STATE: ocp.PyTreeCheckpointHandler(), CONFIG: ocp.JsonCheckpointHandler()})
  try:
    step = manager.latest_step()
    if step is None:
      raise FileNotFoundError(f"{checkpoints}: holds no checkpoint step")
    tree = manager.item_metadata(step)[STATE].tree
    config = manager.restore(step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()}))
  finally:
    manager.close()
  model = (config.get(CONFIG) or {}).get("model")
  if not model:
    raise ValueError(f"{checkpoints}: step {step} has no config with a 'model' section")
  return model, set(tree.get("params", {}))


def abstract_params(cfg: EncoderConfig) -> Params:
  """ShapeDtypeStructs (on the first device) of EncoderForMaskedLM's params."""
  ids_BxL = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(EncoderForMaskedLM(cfg).init, jax.random.key(0), ids_BxL)["params"]
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      nn.meta.unbox(shapes))
