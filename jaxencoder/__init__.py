"""jaxencoder: Transformer encoders in JAX/Flax, for text, image patches and time series."""

from jaxencoder.config import PRESETS, EncoderConfig
from jaxencoder.encoder import BlockInputs, Encoder, EncoderBlock, EncoderOutput
from jaxencoder.heads import (
    ContrastiveHead,
    EncoderForMaskedLM,
    MlmHead,
    SequenceClassificationHead,
    TokenClassificationHead,
    cosine_similarity,
    info_nce_loss,
)
from jaxencoder.layout import loop_to_scan, scan_to_loop

__all__ = [
    "PRESETS", "EncoderConfig", "Encoder", "EncoderBlock", "BlockInputs", "EncoderOutput",
    "EncoderForMaskedLM", "MlmHead", "SequenceClassificationHead",
    "TokenClassificationHead", "ContrastiveHead", "cosine_similarity", "info_nce_loss",
    "loop_to_scan", "scan_to_loop",
]
__version__ = "0.1.0"
