"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)
as Keras 3 layers.

The layers, the model, the loss, the schedule and decoding are written in `keras.ops` and run
on every Keras backend (TensorFlow, JAX, PyTorch) and without TensorFlow installed; the
tokenizer (TF Text), the `Translator` and the `tf.data` pipelines need TensorFlow, and are
imported when first used (`keras_transformer.Tokenizer`), so that importing the package does
not import TensorFlow.
"""

import os

# TensorFlow's default CPU allocator maps and zeroes large buffers afresh at every step; the
# BFC allocator reuses them. It is read when TensorFlow loads, so this only takes effect when
# keras_transformer is imported first.
# `TF_CPU_ALLOCATOR_USE_BFC=false` opts out.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
# oneDNN keeps the products it has built for 1,024 shapes by default; a training step on
# batches of changing shapes builds 20-30 new ones, so a product built for a shape that comes
# back was evicted by then. Read when oneDNN builds its first product.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "4096")

from keras_transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.config import PRESETS, ConfigError, TransformerConfig
from keras_transformer.decoder import Decoder, DecoderLayer
from keras_transformer.decoding import beam_search, greedy_search, length_penalty
from keras_transformer.dense import Dense
from keras_transformer.dropout import Dropout
from keras_transformer.embedding import (
    LearnedPositionEmbedding,
    PositionalEncoding,
    SharedEmbedding,
    sinusoid_table,
)
from keras_transformer.encoder import Encoder, EncoderLayer
from keras_transformer.feed_forward import FeedForward
from keras_transformer.layer_norm import LayerNorm, layer_norm
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedTokenAccuracy, Perplexity
from keras_transformer.masks import causal_mask, padding_mask
from keras_transformer.model import Transformer
from keras_transformer.optimizer import (TokenWeightedAdam, TokenWeightedLossScaleOptimizer,
                                        make_optimizer)
from keras_transformer.outputs import WithCache, WithCacheAndWeights, WithWeights
from keras_transformer.schedule import ScheduleCallback, TransformerSchedule

# keras-hub's classes (registered for from_preset): keras_transformer.hub.TransformerSeq2SeqLM etc.
# Where keras-hub is not installed (a bare JAX machine, say) there is nothing to register.
import importlib.util  # noqa: E402

if importlib.util.find_spec("keras_hub") is not None:
    from keras_transformer import hub  # noqa: F401  (after the layers it builds on)

__version__ = "0.2.0"

# What needs TensorFlow, imported on first use (PEP 562): names and modules.
_NEEDS_TENSORFLOW = {"Tokenizer": "keras_transformer.tokenizer",
                     "Translator": "keras_transformer.translator"}


def __getattr__(name):
    import importlib

    if name in _NEEDS_TENSORFLOW:
        return getattr(importlib.import_module(_NEEDS_TENSORFLOW[name]), name)
    if name in ("tokenizer", "translator", "data", "run_dir"):
        return importlib.import_module(f"keras_transformer.{name}")
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
