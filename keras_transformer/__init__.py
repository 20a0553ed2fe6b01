"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)
as Keras 3 layers on TensorFlow."""

from keras_transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.config import PRESETS, ConfigError, TransformerConfig
from keras_transformer.decoder import Decoder, DecoderLayer, causal_mask
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
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy
from keras_transformer.model import Transformer
from keras_transformer.schedule import (
    FusedAdam,
    ScheduleCallback,
    TransformerSchedule,
    make_optimizer,
)
from keras_transformer.tokenizer import Tokenizer
from keras_transformer.translator import Translator

__version__ = "0.1.0"
