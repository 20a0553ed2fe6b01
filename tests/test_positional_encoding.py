import keras
import numpy as np
import tensorflow as tf

from keras_transformer import LearnedPositionEmbedding, PositionalEncoding


def paper_formula(positions, d_model):
    table = np.zeros((len(positions), d_model))
    for row, pos in enumerate(positions):
        for i in range(d_model // 2):
            table[row, 2 * i] = np.sin(pos / 10000 ** (2 * i / d_model))
            table[row, 2 * i + 1] = np.cos(pos / 10000 ** (2 * i / d_model))
    return table


def test_matches_formula_with_offset():
    layer = PositionalEncoding()
    x = tf.zeros((2, 7, 16))
    np.testing.assert_allclose(layer(x)[0], paper_formula(range(7), 16), atol=1e-5)
    np.testing.assert_allclose(layer(x, start_index=100)[0], paper_formula(range(100, 107), 16),
                               atol=1e-5)


def test_worked_example_from_the_paper():
    table = PositionalEncoding()(tf.zeros((1, 4, 8)))[0].numpy()
    np.testing.assert_allclose(table[0], [0, 1, 0, 1, 0, 1, 0, 1], atol=1e-7)
    np.testing.assert_allclose(table[1, :2], [np.sin(1.0), np.cos(1.0)], atol=1e-6)


def test_bfloat16_keeps_positions_256_and_257_apart():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    layer = PositionalEncoding()
    table = layer(tf.zeros((1, 300, 64), tf.bfloat16))[0]
    assert table.dtype == tf.bfloat16
    assert np.any(table[256].numpy() != table[257].numpy())
    np.testing.assert_allclose(tf.cast(table, tf.float32), paper_formula(range(300), 64),
                               atol=1e-2)


def test_learned_positions_follow_offset():
    layer = LearnedPositionEmbedding(max_length=10)
    x = tf.zeros((1, 3, 4))
    np.testing.assert_allclose(layer(x, start_index=2)[0], layer.position_embeddings[2:5])
