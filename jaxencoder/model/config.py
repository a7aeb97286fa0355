"""EncoderConfig: the frozen description of an encoder's architecture."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# BERT's size table (Turc et al. 2019; Devlin et al. 2019): layers, width, heads.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# ModernBERT's architecture apart from its sizes (Warner et al. 2024; Hugging Face
# ModernBertConfig: local_attention 128 is |i - j| <= 64): configs/modernbert_*.py start
# from it, a few keys overridden.
MODERNBERT = dict(type_vocab_size=0, position_embedding="rope", rope_base=160_000.0,
                  local_rope_base=10_000.0, global_attention_every=3, sliding_window=64,
                  activation="geglu", norm_position="pre", first_attention_norm=False,
                  use_bias=False, norm_bias=False, norm_eps=1e-5, family="modernbert")

INPUT_KINDS = ("text", "image", "series")
# Hugging Face layout a checkpoint converts back to (jaxencoder.pretrained).
CHECKPOINT_FAMILIES = ("bert", "roberta", "distilbert", "electra", "modernbert", "vit")
POSITION_KINDS = ("learned", "sinusoidal", "rope", "relative", "none")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "fused", "linear")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("post", "pre")
POOLINGS = ("cls", "mean", "max", "attention")
REMAT_POLICIES = ("none", "full", "save_dots", "save_dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")
GATED_ACTIVATIONS = ("swiglu", "geglu")  # ffn.py: wi_gate and wi_up instead of wi


def block_kernels(cfg) -> tuple[str, ...]:
  """The Dense kernels of an encoder block, by their path in the block (attention.py,
  ffn.py): what `lora_targets` is matched against. tests/test_lora.py checks the table
  against a real block."""
  ffn = ("wi_gate", "wi_up") if cfg.activation in GATED_ACTIVATIONS else ("wi",)
  return (tuple(f"attention/{p}/kernel" for p in ("query", "key", "value", "out"))
          + tuple(f"ffn/{p}/kernel" for p in ffn + ("wo",)))


def local_layer(cfg, layer):
  """Whether layer `layer` (an int, or traced in a scanned stack) attends locally; None
  without a per-layer pattern (every layer then uses cfg.sliding_window)."""
  if not cfg.global_attention_every:
    return None
  return layer % cfg.global_attention_every != 0


def dataclass_from_dict(cls, fields: dict[str, Any] | None, noun: str = "field"):
  """cls(**fields), rejecting unknown keys by name so that typos do not pass silently."""
  fields = dict(fields or {})
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ValueError(f"{cls.__name__}: unknown {noun}(s) {unknown}; valid {noun}s: {sorted(known)}")
  return cls(**fields)


def image_stride_name(cfg) -> str:
  """'patch_size=P', or with a strided stem 'patch_size=P x stem_stride=S^n = N'."""
  if cfg.image_stride == cfg.patch_size:
    return f"patch_size={cfg.patch_size}"
  return (f"patch_size={cfg.patch_size} x stem_stride={cfg.stem_stride}^"
          f"{len(cfg.stem_channels)} = {cfg.image_stride}")


def _runtime(default):
  """A field that says how to run a model, not what it is: with init_from it keeps the
  training config's value (the stack layout is converted on load)."""
  return dataclasses.field(default=default, metadata={"runtime": True})


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Architecture of an encoder. Defaults describe BERT-base without its vocab.

  `head_dim` and `mlp_dim` default to `emb_dim // num_heads` and `4 * emb_dim`.
  `dtype` is the compute dtype; parameters are stored in `param_dtype`.
  """

  # Input front end.
  input_kind: str = "text"  # text: ids [B, L]; image: [B, H, W, C]; series: [B, L, F]
  vocab_size: int = 30522
  type_vocab_size: int = 2  # 0 disables token-type embeddings
  image_size: tuple[int, int] = (224, 224)
  patch_size: int = 16
  num_channels: int = 3
  use_cls_token: bool = True  # image/series: prepend a learned [CLS] vector
  input_features: int = 1  # series: F
  # image: output channels of 3x3 convolutions (each with stride `stem_stride`, GELU) run
  # before patchify, a convolutional stem (Xiao et al. 2021, "Early convolutions help
  # transformers see better"); () is the plain ViT patch embedding. Patches of
  # `patch_size` are then cut from the stem's output: one token per `image_stride` pixels.
  stem_channels: tuple[int, ...] = ()
  stem_stride: int = 1

  # Sizes.
  num_layers: int = 12
  emb_dim: int = 768
  num_heads: int = 12
  head_dim: int | None = None
  mlp_dim: int | None = None
  max_len: int = 512  # rows of the learned position table
  # Learned positions 0..L-1 read table rows offset..offset+L-1 (RoBERTa: pad id + 1).
  position_offset: int = 0
  # Width E of the token/position/type tables when != emb_dim, projected E -> D
  # (ELECTRA's embeddings_project); None: E = emb_dim, no projection.
  embedding_dim: int | None = None

  # Embeddings and positions.
  position_embedding: str = "learned"
  scale_embeddings: bool = False  # multiply token embeddings by sqrt(D)
  embedding_norm: bool = True  # BERT's LayerNorm after summing embeddings
  rope_base: float = 10_000.0
  # RoPE linear position interpolation: angles of position / rope_scaling (> 1 stretches
  # a model trained on L positions to about rope_scaling * L).
  rope_scaling: float = 1.0
  relative_num_buckets: int = 32
  relative_max_distance: int = 128

  # Blocks.
  # auto: cudnn on GPU, splash on TPU, xla elsewhere; see attention.py and flash.py.
  attention_impl: str = _runtime("auto")
  causal: bool = False
  sliding_window: int | None = None  # attend only to |i - j| <= window
  # n > 0: layers i % n == 0 attend globally, the others within `sliding_window`
  # (ModernBERT: 3); 0: every layer uses `sliding_window`.
  global_attention_every: int = 0
  local_rope_base: float | None = None  # RoPE base of those local layers; None: rope_base
  activation: str = "gelu"
  norm: str = "layernorm"
  norm_position: str = "post"  # BERT is post-norm
  norm_eps: float = 1e-12
  use_bias: bool = True
  norm_bias: bool = True  # LayerNorm's bias, apart from use_bias (ModernBERT: False)
  # False: layer 0 attends to its input unnormalised (pre-norm; ModernBERT). Its
  # attention_norm param stays, unused, so looped and scanned stacks keep one layout.
  first_attention_norm: bool = True
  dropout_rate: float = _runtime(0.1)
  attention_dropout_rate: float = _runtime(0.1)
  # Dropout on the feed-forward hidden layer [B, L, F]; 0 in BERT, 0.1 in T5.
  mlp_dropout_rate: float = _runtime(0.0)
  initializer_range: float = _runtime(0.02)

  # Stack.
  scan_layers: bool = _runtime(False)
  remat_policy: str = _runtime("none")

  # Pooling.
  pooling: str = "cls"
  pooler_dense: bool = False  # BERT's pooler: dense + tanh on the pooled vector

  # Numerics.
  dtype: str = _runtime("float32")
  param_dtype: str = _runtime("float32")

  # LoRA (Hu et al. 2021; jaxencoder/model/lora.py): rank > 0 adds adapters A [in, r] and
  # B [r, out] (B = 0 at init) beside every block kernel whose path in the block
  # (`block_kernels`, e.g. "attention/query/kernel") `lora_targets` (a regex) matches:
  # y = x W + (lora_alpha / r) dropout(x) A B. The optimizer then trains only the
  # adapters in the encoder (and the heads); see train/optim.py.
  lora_rank: int = _runtime(0)
  lora_alpha: float = _runtime(16.0)
  lora_targets: str = _runtime("query|value")
  lora_dropout: float = _runtime(0.0)  # on the adapters' input

  # Checks. Outside jit, ids are always range-checked; True checks them under jit too
  # (a host callback per call that raises naming the bad id; costs a device -> host copy).
  check_ids: bool = _runtime(False)

  # Provenance: the Hugging Face family `jaxencoder.pretrained.save` writes ("bert" on an
  # image encoder means its one image family, "vit").
  family: str = "bert"

  def __post_init__(self):
    for name in ("image_size", "stem_channels"):
      if isinstance(getattr(self, name), list):
        object.__setattr__(self, name, tuple(getattr(self, name)))
    if self.input_kind == "image" and self.family == "bert":  # the default, on images
      object.__setattr__(self, "family", "vit")
    self._validate()

  # ---------------------------------------------------------------- fields
  @classmethod
  def runtime_fields(cls) -> tuple[str, ...]:
    """The fields marked `_runtime` (how to run, not what the model is)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("runtime"))

  @classmethod
  def optional_fields(cls) -> dict[str, type]:
    """Fields that default to None, with the type a value of theirs takes."""
    kinds = {"int | None": int, "float | None": float, "str | None": str}
    return {f.name: kinds[str(f.type)] for f in dataclasses.fields(cls) if f.default is None}

  # ---------------------------------------------------------------- derived
  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.emb_dim // self.num_heads

  @property
  def resolved_mlp_dim(self) -> int:
    return self.mlp_dim or 4 * self.emb_dim

  @property
  def max_positions(self) -> int:
    """Longest text the learned position table serves: max_len - position_offset."""
    return self.max_len - self.position_offset

  @property
  def image_stride(self) -> int:
    """Pixels per token along each side: patch_size x the stem's downsampling."""
    return self.patch_size * self.stem_stride ** len(self.stem_channels)

  @property
  def patch_grid(self) -> tuple[int, int]:
    return (self.image_size[0] // self.image_stride,
            self.image_size[1] // self.image_stride)

  @property
  def lora_scale(self) -> float:
    """alpha / r: the adapters' update is scaled by it."""
    return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

  def lora_adapts(self, kernel: str) -> bool:
    """Whether the block kernel at `kernel` (e.g. "attention/query/kernel") gets adapters."""
    return self.lora_rank > 0 and re.search(self.lora_targets, kernel) is not None

  @property
  def has_cls_token(self) -> bool:
    """Whether position 0 of the stack's input is a [CLS] vector."""
    return self.input_kind == "text" or self.use_cls_token

  # ---------------------------------------------------------------- building
  @classmethod
  def preset(cls, name: str, **overrides: Any) -> "EncoderConfig":
    """BERT-size preset (`tiny` … `large`) with any field overridden."""
    if name not in PRESETS:
      raise ValueError(f"preset: unknown name {name!r}; choose from {sorted(PRESETS)}")
    num_layers, emb_dim, num_heads = PRESETS[name]
    fields = dict(num_layers=num_layers, emb_dim=emb_dim, num_heads=num_heads)
    fields.update(overrides)
    return cls.from_dict(fields)

  @classmethod
  def from_dict(cls, fields: dict[str, Any]) -> "EncoderConfig":
    """Builds a config, rejecting unknown keys by name."""
    return dataclass_from_dict(cls, fields)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def replace(self, **overrides: Any) -> "EncoderConfig":
    return self.from_dict({**self.to_dict(), **overrides})

  # ---------------------------------------------------------------- checks
  def _validate(self) -> None:
    choices = {
        "input_kind": INPUT_KINDS, "position_embedding": POSITION_KINDS,
        "attention_impl": ATTENTION_IMPLS, "activation": ACTIVATIONS,
        "norm": NORMS, "norm_position": NORM_POSITIONS, "pooling": POOLINGS,
        "remat_policy": REMAT_POLICIES, "dtype": DTYPES, "param_dtype": DTYPES,
        "family": CHECKPOINT_FAMILIES,
    }
    for name, allowed in choices.items():
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name}={getattr(self, name)!r} is not one of {allowed}")
    positive = ("num_layers", "emb_dim", "num_heads", "max_len", "patch_size", "stem_stride",
                "num_channels", "input_features", "vocab_size")
    for name in positive:
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    if not 0 <= self.position_offset < self.max_len:
      raise ValueError(f"position_offset={self.position_offset} must be in [0, "
                       f"max_len={self.max_len})")
    if self.embedding_dim is not None and (self.embedding_dim in (0, self.emb_dim) or
                                           self.embedding_dim < 0 or self.input_kind != "text"):
      raise ValueError(f"embedding_dim={self.embedding_dim} must be a positive width other than "
                       f"emb_dim={self.emb_dim} (None: no projection), for input_kind='text' "
                       f"(got {self.input_kind!r})")
    if self.head_dim is None and self.emb_dim % self.num_heads:
      raise ValueError(f"emb_dim={self.emb_dim} is not divisible by num_heads={self.num_heads}; "
                       "change one or set head_dim explicitly")
    if self.rope_scaling <= 0:
      raise ValueError(f"rope_scaling must be positive, got {self.rope_scaling}")
    if self.position_embedding == "rope" and self.resolved_head_dim % 2:
      raise ValueError(f"head_dim={self.resolved_head_dim} must be even for rope positions")
    for name in ("dropout_rate", "attention_dropout_rate", "mlp_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
    if self.sliding_window is not None and self.sliding_window < 0:
      raise ValueError(f"sliding_window must be >= 0, got {self.sliding_window}")
    if self.input_kind == "image":
      self._validate_image()
    elif self.stem_channels:
      raise ValueError(f"stem_channels={self.stem_channels} is for input_kind='image' "
                       f"(got {self.input_kind!r})")
    if self.pooling == "cls" and not self.has_cls_token:
      raise ValueError("pooling='cls' needs a [CLS] vector: set use_cls_token=True "
                       "or choose pooling 'mean', 'max' or 'attention'")
    self._validate_layer_pattern()
    self._validate_lora()
    if self.attention_impl == "linear":
      unsupported = {"causal": self.causal, "sliding_window": self.sliding_window is not None,
                     "position_embedding='relative'": self.position_embedding == "relative"}
      bad = [k for k, v in unsupported.items() if v]
      if bad:
        raise ValueError(f"attention_impl='linear' does not support {bad}")

  def _validate_layer_pattern(self) -> None:
    if self.global_attention_every < 0:
      raise ValueError(f"global_attention_every must be >= 0, got {self.global_attention_every}")
    if self.global_attention_every and self.sliding_window is None:
      raise ValueError("global_attention_every > 0 needs sliding_window (the local layers' window)")
    if self.global_attention_every and self.causal:
      raise ValueError("global_attention_every > 0 is for bidirectional encoders; set causal=False")
    if self.local_rope_base is not None and (
        not self.global_attention_every or self.position_embedding != "rope"):
      raise ValueError("local_rope_base needs position_embedding='rope' and "
                       "global_attention_every > 0 (it is the local layers' RoPE base)")
    if not self.first_attention_norm and self.norm_position != "pre":
      raise ValueError("first_attention_norm=False needs norm_position='pre'")

  def _validate_lora(self) -> None:
    if self.lora_rank < 0 or not isinstance(self.lora_rank, int):
      raise ValueError(f"lora_rank must be an integer >= 0 (0: no LoRA), got {self.lora_rank!r}")
    if not 0.0 <= self.lora_dropout < 1.0:
      raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
    if not self.lora_rank:
      return
    if self.lora_alpha <= 0:
      raise ValueError(f"lora_alpha must be positive, got {self.lora_alpha}")
    try:
      re.compile(self.lora_targets)
    except re.error as e:
      raise ValueError(f"lora_targets={self.lora_targets!r} is not a regex: {e}") from None
    kernels = block_kernels(self)
    if not any(self.lora_adapts(k) for k in kernels):
      raise ValueError(f"lora_targets={self.lora_targets!r} matches no block kernel; "
                       f"kernels: {', '.join(kernels)}")

  def _validate_image(self) -> None:
    if any(c <= 0 for c in self.stem_channels):
      raise ValueError(f"stem_channels must be positive channel counts, got {self.stem_channels}")
    if len(self.image_size) != 2:
      raise ValueError(f"image_size must be (height, width), got {self.image_size}")
    for side in self.image_size:
      if side % self.image_stride:
        raise ValueError(f"image_size={self.image_size} is not divisible by "
                         f"{image_stride_name(self)}")
