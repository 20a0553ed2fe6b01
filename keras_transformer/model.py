"""The full encoder-decoder Transformer (§3, Figure 1)."""

import keras
from keras import ops

from keras_transformer.config import TransformerConfig
from keras_transformer.decoder import Decoder
from keras_transformer.embedding import SharedEmbedding
from keras_transformer.encoder import Encoder
from keras_transformer.losses import global_sum, training_step
from keras_transformer.masks import padding_mask
from keras_transformer.optimizer import TokenWeightedLossScaleOptimizer, unwrapped
from keras_transformer.outputs import layer_output, split_output


def _reducible_across_workers(logs):
    """Keras 3 reduces step results across MultiWorkerMirroredStrategy workers with
    `strategy.reduce("MEAN", value, axis=0)`, which fails on scalars (tensorflow#72388);
    [1]-shaped values reduce to the same scalar mean. (TensorFlow only: other backends' step
    results pass through.)"""
    if keras.backend.backend() != "tensorflow":
        return logs
    import tensorflow as tf

    if isinstance(tf.distribute.get_strategy(), tf.distribute.MultiWorkerMirroredStrategy):
        return {name: tf.reshape(value, [1]) for name, value in logs.items()}
    return logs


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The Transformer of §3: a shared embedding (§3.4), the encoder and the decoder (§3.1),
    and the pre-softmax linear map tied to the embedding.

    Call: {"source_ids": [B, S] int, "target_ids": [B, T] int} (the target shifted right; pad
    id `config.pad_id`). Returns logits [B, T, vocab_size] in float32. Padding masks are built
    from the ids, so padding never changes a real position's output. Rows that hold several
    sentence pairs (`make_dataset(batching="concat")`) add "source_segment_ids",
    "target_segment_ids" (1, 2, ... per pair, 0 for padding), "source_positions" and
    "target_positions" (restarting at 0 in each pair): each pair is then computed as if alone.

    For decoding: `encode`, `init_cache` and `decode_step` (one position per call).
    """

    def __init__(self, config=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        self.config = config or TransformerConfig()
        c = self.config
        stack_args = dict(num_layers=c.num_layers, num_heads=c.num_heads, d_ff=c.d_ff,
                          key_dim=c.key_dim, num_kv_heads=c.num_kv_heads, dropout=c.dropout,
                          attention_dropout=c.attention_dropout, norm_first=c.norm_first,
                          layer_norm_epsilon=c.layer_norm_epsilon, position=c.position,
                          max_length=c.max_length, dtype=self.dtype_policy)
        self.embedding = SharedEmbedding(c.vocab_size, c.d_model, name="shared_embedding",
                                         dtype=self.dtype_policy)
        self.encoder = Encoder(**stack_args, name="encoder")
        self.decoder = Decoder(**stack_args, name="decoder")

    def build(self, input_shape=None):
        shape = (None, None, self.config.d_model)
        self.embedding.build()
        self.encoder.build(shape)
        self.decoder.build(shape, shape)
        self.built = True

    def padding_mask(self, ids):
        """ids [B, T] -> [B, T] bool, True for real tokens (not `config.pad_id`)."""
        return padding_mask(ids, self.config.pad_id)

    def encode(self, source_ids, return_attention_scores=False, training=None,
               segment_ids=None, positions=None):
        """source_ids [B, S] -> memory [B, S, d_model]; with `return_attention_scores`, a
        `WithWeights` holding the per-layer weights [B, h, S, S] too."""
        return self.encoder(self.embedding(source_ids), self.padding_mask(source_ids),
                            return_attention_scores=return_attention_scores, training=training,
                            segment_ids=segment_ids, positions=positions)

    def decode(self, target_ids, memory, source_ids, return_attention_scores=False,
               training=None, segment_ids=None, source_segment_ids=None, positions=None):
        """Logits [B, T, vocab_size] (float32) of the shifted-right target [B, T] against
        memory [B, S, d_model]; with `return_attention_scores`, a `WithWeights` holding the
        per-layer {"self", "cross"} weights too."""
        out = self.decoder(self.embedding(target_ids), memory, self.padding_mask(target_ids),
                           self.padding_mask(source_ids),
                           return_attention_scores=return_attention_scores, training=training,
                           segment_ids=segment_ids, memory_segment_ids=source_segment_ids,
                           positions=positions)
        hidden, _, weights = split_output(out)
        return layer_output(self.embedding.logits(hidden), weights=weights)

    def call(self, inputs, training=None):
        source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        source_segments = inputs.get("source_segment_ids")
        memory = self.encode(source_ids, training=training, segment_ids=source_segments,
                             positions=inputs.get("source_positions"))
        return self.decode(target_ids, memory, source_ids, training=training,
                           segment_ids=inputs.get("target_segment_ids"),
                           source_segment_ids=source_segments,
                           positions=inputs.get("target_positions"))

    def init_cache(self, memory, max_length):
        """Per-layer decoding caches: self-attention buffers of `max_length` positions and
        encoder-decoder keys/values computed once from `memory`."""
        return self.decoder.init_cache(memory, max_length)

    def decode_step(self, token_ids, cache, index, memory_mask, return_attention_scores=False):
        """One decoding step (inference mode).

        token_ids [B, 1] at position `index`; cache from `init_cache`; memory_mask [B, S] bool.
        Returns a `WithCache`: logits [B, vocab_size] float32 and the new cache (a
        `WithCacheAndWeights` with the per-layer attention weights if asked).
        """
        hidden, cache, weights = split_output(self.decoder(
            self.embedding(token_ids), None, memory_mask=memory_mask, cache=cache,
            cache_index=index, return_attention_scores=return_attention_scores, training=False))
        # Decoding scores from a float32 product (`SharedEmbedding.logits`).
        logits = self.embedding.logits(hidden, float32_product=True)[:, -1]
        return layer_output(logits, cache=cache, weights=weights)

    def compile(self, optimizer="rmsprop", *args, auto_scale_loss=True, **kwargs):
        """`keras.Model.compile`; under `mixed_float16` the optimizer is wrapped in a
        `TokenWeightedLossScaleOptimizer` (Keras' own would drop the token weighting)."""
        optimizer = keras.optimizers.get(optimizer)
        if (auto_scale_loss and self.dtype_policy.name == "mixed_float16"
                and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
            optimizer = TokenWeightedLossScaleOptimizer(optimizer, name="loss_scale_optimizer")
        super().compile(optimizer, *args, auto_scale_loss=auto_scale_loss, **kwargs)

    def train_step(self, *args):
        # (data) on TensorFlow and PyTorch, (state, data) on JAX, whose step is stateless:
        # the count below is read by the optimizer inside the same traced step.
        data = args[-1]
        optimizer = unwrapped(self.optimizer)
        if getattr(optimizer, "gradient_accumulation_steps", None) and hasattr(
                optimizer, "micro_batch_tokens"):
            # TokenWeightedAdam weights micro-batches by their real tokens (global over replicas).
            labels = data[1]
            real = ops.sum(ops.cast(self.padding_mask(labels), "float32"))
            optimizer.micro_batch_tokens = global_sum(real)
        with training_step():
            result = super().train_step(*args)
        if keras.backend.backend() == "jax":
            logs, state = result
            return self._training_logs(logs), state
        return _reducible_across_workers(self._training_logs(result))

    def _training_logs(self, logs):
        """The step's logs without the metrics made with `in_training=False` (not updated in
        training steps, so their values would be stale)."""
        metrics = getattr(self._compile_metrics, "metrics", None) or []
        left_out = {m.name for m in metrics if getattr(m, "in_training", True) is False}
        return {name: value for name, value in logs.items() if name not in left_out}

    def test_step(self, *args):
        return _reducible_across_workers(super().test_step(*args))

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Under a distribution strategy Keras 3 builds the compiled loss and metrics by taking
        # the next batch from the training iterator, which silently drops that batch from
        # training. The model is shape-agnostic: a 1x1 batch of the same structure builds the
        # same things and leaves the data alone.
        if iterator is not None and getattr(self, "_distribute_strategy", None) is not None:
            ids = ops.full((1, 1), self.config.pad_id + 3, dtype="int32")
            iterator, data_batch = None, ({"source_ids": ids, "target_ids": ids}, ids, None)
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _seed_states(self):
        return [v for v in self.variables if "seed_generator_state" in v.path]

    def save_own_variables(self, store):
        # Keras leaves the dropout layers' random-number states out of weight files; saving
        # them makes a run restored from a checkpoint draw the same dropout masks as one that
        # never stopped. (The model has no variables of its own besides these.)
        for i, state in enumerate(self._seed_states()):
            store[f"seed_{i}"] = keras.ops.convert_to_numpy(state)

    def load_own_variables(self, store):
        states = self._seed_states()
        if len([key for key in store.keys() if key.startswith("seed_")]) == len(states):
            for i, state in enumerate(states):
                state.assign(store[f"seed_{i}"])

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
