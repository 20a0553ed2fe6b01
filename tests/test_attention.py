import keras
import numpy as np
import tensorflow as tf

from keras_transformer import MultiHeadAttention, scaled_dot_product_attention


def numpy_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(-1, keepdims=True)
    return weights @ v, weights


def test_scaled_dot_product_attention_matches_numpy(rng):
    q, k = rng.normal(size=(2, 3, 5, 8)), rng.normal(size=(2, 3, 7, 8))
    v = rng.normal(size=(2, 3, 7, 4))
    mask = rng.random((2, 1, 5, 7)) > 0.3
    mask[..., 0] = True
    out, weights = scaled_dot_product_attention(*(tf.constant(a, tf.float32) for a in (q, k, v)),
                                                mask=tf.constant(mask))
    ref_out, ref_weights = numpy_attention(q, k, v, mask)
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    np.testing.assert_allclose(weights, ref_weights, atol=1e-6)
    assert np.all(weights.numpy()[~np.broadcast_to(mask, weights.shape)] == 0)


def test_fully_masked_row_gives_no_nan(rng):
    q = tf.constant(rng.normal(size=(1, 2, 4)), tf.float32)
    mask = tf.constant([[[False, False], [True, False]]])
    out, weights = scaled_dot_product_attention(q, q, q, mask)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(weights))


def numpy_multi_head(layer, query, value, mask, num_heads, num_kv_heads, head_dim):
    def dense(sub, x):
        kernel, bias = (w.numpy() for w in sub.weights)
        return x @ kernel + bias

    b, tq, _ = query.shape
    tk = value.shape[1]
    q = dense(layer.query_dense, query).reshape(b, tq, num_heads, head_dim).transpose(0, 2, 1, 3)
    k = dense(layer.key_dense, value).reshape(b, tk, num_kv_heads, head_dim).transpose(0, 2, 1, 3)
    v = dense(layer.value_dense, value).reshape(b, tk, num_kv_heads, head_dim).transpose(0, 2, 1, 3)
    group = num_heads // num_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head i uses kv head i//g
    out, weights = numpy_attention(q, k, v, mask[:, None])
    out = out.transpose(0, 2, 1, 3).reshape(b, tq, num_heads * head_dim)
    return dense(layer.output_dense, out), weights


def check_multi_head(rng, num_heads, num_kv_heads=None, key_dim=None, mask_rows=5):
    """`mask_rows` 1: one mask row for every query (a padding mask, broadcast)."""
    query, value = rng.normal(size=(2, 5, 16)), rng.normal(size=(2, 6, 16))
    mask = rng.random((2, mask_rows, 6)) > 0.4
    mask[..., 0] = True
    layer = MultiHeadAttention(num_heads, key_dim=key_dim, num_kv_heads=num_kv_heads)
    out, weights = layer(tf.constant(query, tf.float32), tf.constant(value, tf.float32),
                         attention_mask=tf.constant(mask), return_attention_scores=True)
    ref_out, ref_weights = numpy_multi_head(layer, query, value, mask, num_heads,
                                            num_kv_heads or num_heads, key_dim or 16 // num_heads)
    np.testing.assert_allclose(out, ref_out, atol=1e-4)
    np.testing.assert_allclose(weights, ref_weights, atol=1e-5)


def test_multi_head_attention_matches_numpy(rng):
    check_multi_head(rng, num_heads=4)


def test_multi_head_attention_key_dim_and_single_head(rng):
    check_multi_head(rng, num_heads=1)  # Table 3 row A: h = 1, d_k = d_model
    check_multi_head(rng, num_heads=4, key_dim=3)  # Table 3 row B: d_k set on its own


def test_grouped_query_attention_matches_numpy(rng):
    check_multi_head(rng, num_heads=4, num_kv_heads=2)
    check_multi_head(rng, num_heads=4, num_kv_heads=1)  # multi-query
    check_multi_head(rng, num_heads=4, num_kv_heads=2, mask_rows=1)


def test_cached_self_attention_equals_full_pass(rng):
    layer = MultiHeadAttention(4, num_kv_heads=2)
    x = tf.constant(rng.normal(size=(2, 6, 16)), tf.float32)
    causal = tf.linalg.band_part(tf.ones((6, 6), tf.bool), -1, 0)
    full = layer(x, attention_mask=causal[None])
    cache = layer.init_cache(2, 8)
    for step in range(6):
        keys_seen = tf.range(8)[None, None, :] <= step
        out, cache = layer(x[:, step:step + 1], attention_mask=keys_seen, cache=cache,
                           cache_index=step)
        np.testing.assert_allclose(out[:, 0], full[:, step], atol=1e-5)


def test_cache_write_scatter_equals_slice_update(rng):
    """The decoding cache's write on TensorFlow (a scatter, which stock TF Serving runs) and on
    the other backends (`ops.slice_update`) against NumPy assignment, at every position, over
    non-zero slots too; eagerly, where the buffer given must stay as it was, in a function,
    where the write reuses a buffer that the function made, and compiled by XLA."""
    from keras_transformer import cache

    @tf.function(autograph=False)
    def in_graph(buffer, update, index):  # `buffer * 1.0`: a tensor only the write holds
        return cache.scatter_write(buffer * 1.0, update, index)

    under_xla = tf.function(cache.scatter_write, jit_compile=True, autograph=False)
    for dtype in ("float32", "bfloat16"):
        buffer = rng.normal(size=(2, 3, 7, 4)).astype(dtype)
        for steps in (1, 3):
            update = rng.normal(size=(2, 3, steps, 4)).astype(dtype)
            for index in range(7 - steps + 1):
                expected = buffer.copy()
                expected[:, :, index:index + steps] = update
                given = tf.constant(buffer)
                for write in (cache.scatter_write, in_graph, under_xla):
                    written = write(given, tf.constant(update), tf.constant(index))
                    np.testing.assert_array_equal(written.numpy(), expected)
                np.testing.assert_array_equal(given.numpy(), buffer)
                sliced = keras.ops.slice_update(buffer, (0, 0, index, 0), update)
                np.testing.assert_array_equal(sliced, expected)
