"""Model configuration: one dataclass, with the paper's sizes as named presets (Table 3)."""

import dataclasses

# The special token ids of every vocabulary this library writes (keras_transformer/tokenizer.py).
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

PRESETS = {
    # Small enough to train in minutes on two CPU cores; used by tests and the sample corpus.
    "tiny": dict(
        num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout=0.1, vocab_size=8000,
        train_steps=4000, warmup_steps=400,
    ),
    # Table 3, "base": 65M parameters, 100k steps.
    "base": dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout=0.1),
    # Table 3, "big": 213M parameters, 300k steps, P_drop 0.3 for EN-DE.
    "big": dict(
        num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout=0.3, train_steps=300_000
    ),
}


# How `make_dataset` forms batches (keras_transformer/data/pipeline.py).
BATCHING = ("packed", "mixed", "concat")


class ConfigError(ValueError):
    """A setting that cannot work; the message names it and says what to change."""


def source_length_limit(max_length, max_extra, max_input_length=None):
    """How many tokens of a source translation keeps, its EOS included: `max_input_length`,
    else what leaves `max_extra` target tokens within the model's `max_length` positions.
    Every engine (Translator, the SavedModel, CTranslate2) keeps a longer source's first
    `limit - 1` pieces, then the EOS."""
    length = max_input_length or max_length - max_extra
    if length < 1:
        raise ConfigError(f"max_extra={max_extra} leaves no room for the source within "
                          f"max_length={max_length}: lower --max_extra.")
    return length


@dataclasses.dataclass
class TransformerConfig:
    """Every knob of Table 3, with the paper's base model as the defaults.

    `key_dim` is d_k = d_v (default d_model / num_heads, rows A and B of Table 3 set it).
    `num_kv_heads` below `num_heads` gives grouped-query attention (a post-2017 variant).
    `position` is "sinusoidal" (§3.5) or "learned" (Table 3 row E). `norm_first` switches the
    paper's post-LN sub-layers to pre-LN with a final norm (a later variant).
    `max_length` bounds learned positions and the decoding cache.
    """

    vocab_size: int = 37_000
    num_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    key_dim: int | None = None
    num_kv_heads: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    label_smoothing: float = 0.1
    position: str = "sinusoidal"
    max_length: int = 1024
    norm_first: bool = False
    layer_norm_epsilon: float = 1e-6
    pad_id: int = 0
    warmup_steps: int = 4000
    train_steps: int = 100_000

    def __post_init__(self):
        if self.position not in ("sinusoidal", "learned"):
            raise ConfigError(
                f"position={self.position!r}: use 'sinusoidal' (§3.5) or 'learned' (Table 3 E)."
            )
        if self.key_dim is None and self.d_model % self.num_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}: "
                "set key_dim explicitly."
            )
        kv_heads = self.num_kv_heads or self.num_heads
        if self.num_heads % kv_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={kv_heads}."
            )

    @classmethod
    def preset(cls, name, **overrides):
        """`TransformerConfig.preset("base", dropout=0.2)`: a named size plus overrides."""
        if name not in PRESETS:
            raise ConfigError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"Unknown TransformerConfig fields: {sorted(unknown)}.")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self):
        """The fields as a plain dict (what config.json holds)."""
        return dataclasses.asdict(self)

    def shape_differences(self, other):
        """The fields whose values differ between `self` and `other` and that change the
        model's weights (their number or shapes, or what they mean): [(name, mine, theirs)]."""
        names = list(SHAPE_FIELDS) + (["max_length"] if "learned" in (self.position,
                                                                      other.position) else [])
        return [(name, getattr(self, name), getattr(other, name)) for name in names
                if getattr(self, name) != getattr(other, name)]

    @classmethod
    def from_dict(cls, values):
        """The config a `to_dict` dict describes."""
        return cls(**values)


# Fields a trained model's weights depend on (plus max_length with learned positions).
SHAPE_FIELDS = ("vocab_size", "num_layers", "d_model", "d_ff", "num_heads", "key_dim",
                "num_kv_heads", "position", "norm_first", "pad_id")

# One line per field, for the command line's --help.
FIELD_HELP = {
    "vocab_size": "shared source-target SentencePiece vocabulary size",
    "num_layers": "N, layers in the encoder and in the decoder",
    "d_model": "model width (embeddings and every sub-layer output)",
    "d_ff": "inner width of the position-wise feed-forward networks (§3.3)",
    "num_heads": "h, attention heads (§3.2.2)",
    "key_dim": "d_k = d_v per head (default d_model / num_heads)",
    "num_kv_heads": "key/value heads below num_heads: grouped-query attention (a later variant)",
    "dropout": "P_drop, residual and embedding dropout (§5.4)",
    "attention_dropout": "dropout on the attention weights (not in the paper)",
    "label_smoothing": "epsilon_ls of the loss (§5.4)",
    "position": "sinusoidal (§3.5) or learned (Table 3 row E) positions",
    "max_length": "longest sequence the positions and the decoding cache allow",
    "norm_first": "pre-LN sub-layers with a final norm instead of the paper's post-LN "
                  "(bare flag = true)",
    "layer_norm_epsilon": "LayerNorm epsilon",
    "pad_id": "padding token id (must match the vocabulary's)",
    "warmup_steps": "warmup_steps of the §5.3 learning rate",
    "train_steps": "weight updates to train for",
}
