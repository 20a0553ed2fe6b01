"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)
as Keras 3 layers on TensorFlow."""

import os

# TensorFlow's default CPU allocator maps and zeroes large buffers afresh at every step; the
# BFC allocator reuses them (a training step 1.57x faster on a 2-core CPU). It is read when
# TensorFlow loads, so this only takes effect when keras_transformer is imported first.
# `TF_CPU_ALLOCATOR_USE_BFC=false` opts out.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

from keras_transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.config import PRESETS, ConfigError, TransformerConfig
from keras_transformer.decoder import Decoder, DecoderLayer
from keras_transformer.decoding import beam_search, greedy_search, length_penalty
from keras_transformer.dropout import Dropout
from keras_transformer.embedding import (
    LearnedPositionEmbedding,
    PositionalEncoding,
    SharedEmbedding,
    sinusoid_table,
)
from keras_transformer.encoder import Encoder, EncoderLayer
from keras_transformer.feed_forward import FeedForward
from keras_transformer.layer_norm import LayerNorm
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy, Perplexity
from keras_transformer.masks import causal_mask, padding_mask
from keras_transformer.model import Transformer
from keras_transformer.optimizer import (FusedAdam, TokenWeightedAdam,
                                        TokenWeightedLossScaleOptimizer, make_optimizer)
from keras_transformer.outputs import WithCache, WithCacheAndWeights, WithWeights
from keras_transformer.residual import Residual
from keras_transformer.schedule import ScheduleCallback, TransformerSchedule
from keras_transformer.tokenizer import Tokenizer
from keras_transformer.translator import Translator

# keras-hub's classes (registered for from_preset): keras_transformer.hub.TransformerSeq2SeqLM etc.
from keras_transformer import hub  # noqa: E402  (after the layers it builds on)

__version__ = "0.1.0"
