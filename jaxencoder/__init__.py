"""jaxencoder: Transformer encoders in JAX/Flax, for text, image patches and time series
(and a decoder for encoder-decoder models)."""

from jaxencoder.tpu_host import quiet_libtpu_probe

quiet_libtpu_probe()  # before JAX starts a backend: libtpu on a host without TPU chips

from jaxencoder.config import PRESETS, EncoderConfig  # noqa: E402
from jaxencoder.decoder import Decoder, EncoderDecoder, decoder_config, greedy_decode
from jaxencoder.electra import Electra
from jaxencoder.encoder import BlockInputs, Encoder, EncoderBlock, EncoderOutput
from jaxencoder.heads import (
    ContrastiveHead,
    EncoderForMaskedLM,
    EncoderForPreTraining,
    MlmHead,
    SequenceClassificationHead,
    TokenClassificationHead,
    cosine_similarity,
    info_nce_loss,
)
from jaxencoder.stack_layout import loop_to_scan, scan_to_loop

__all__ = [
    "PRESETS", "EncoderConfig", "Encoder", "EncoderBlock", "BlockInputs", "EncoderOutput",
    "Decoder", "EncoderDecoder", "decoder_config", "greedy_decode",
    "EncoderForMaskedLM", "EncoderForPreTraining", "Electra", "MlmHead",
    "SequenceClassificationHead",
    "TokenClassificationHead", "ContrastiveHead", "cosine_similarity", "info_nce_loss",
    "loop_to_scan", "scan_to_loop",
]
__version__ = "0.1.0"
