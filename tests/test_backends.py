"""The layers, the model, the loss and decoding on the JAX backend, where TensorFlow cannot be
imported (tests/backend_check.py, in a fresh process), against the TensorFlow backend's results
on the same weights (a `.weights.h5` file)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from conftest import ROOT, random_ids, small_config

STEPS = 60  # of the short fit on JAX


def _tensorflow_results(model, given):
    inputs = {"source_ids": given["source_ids"], "target_ids": given["target_ids"]}
    loss_fn = kt.LabelSmoothedCrossEntropy(pad_id=model.config.pad_id)
    with tf.GradientTape() as tape:
        logits = model(inputs, training=False)
        loss = loss_fn(given["labels"], logits)
    grads = tape.gradient(loss, model.trainable_variables)
    settings = dict(bos_id=kt.config.BOS_ID, eos_id=kt.config.EOS_ID, max_extra=5)
    return dict(
        logits=logits.numpy(), loss=float(loss),
        grads={v.path: g.numpy() for v, g in zip(model.trainable_variables, grads)},
        greedy=kt.greedy_search(model, given["source_ids"], **settings),
        beam=kt.beam_search(model, given["source_ids"], beam_size=3, alpha=0.6, **settings))


def _padded(ids, shape):
    """ids [B, T] padded with zeros (the pad id) to `shape`."""
    return np.pad(ids, [(0, size - n) for size, n in zip(shape, ids.shape)])


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory, sample_tokenizer):
    """The TensorFlow backend's results here, and backend_check.py's under JAX."""
    from keras_transformer.data import corpora, pipeline

    work = tmp_path_factory.mktemp("backends")
    rng = np.random.default_rng(0)
    config = small_config(vocab_size=sample_tokenizer.vocab_size)
    keras.utils.set_random_seed(0)
    model = kt.Transformer(config)
    model.build()
    model.save_weights(work / "model.weights.h5")
    (work / "config.json").write_text(json.dumps(config.to_dict()))

    given = {"source_ids": random_ids(rng, 3, 7, 50), "target_ids": random_ids(rng, 3, 6, 50)}
    given["labels"] = np.roll(given["target_ids"], -1, axis=1)
    short = (random_ids(rng, 2, 3, 50, 3), random_ids(rng, 2, 2, 50, 2))
    long = (random_ids(rng, 6, 9, 50, 9), random_ids(rng, 6, 8, 50, 8))
    for name, (source, target) in (("short", short), ("long", long)):
        given.update({f"{name}_source": source, f"{name}_target": target,
                      f"{name}_labels": np.roll(target, -1, axis=1)})
    for side in ("source", "target", "labels"):
        # The short micro-batch padded to the long one's shape, so that each model compiles
        # one train step (rows and columns of padding weigh nothing).
        long = given[f"long_{side}"]
        given[f"short_{side}"] = _padded(given[f"short_{side}"], long.shape)
        given[f"both_{side}"] = np.concatenate([given[f"short_{side}"], long])
    np.savez(work / "inputs.npz", **given)

    dataset = pipeline.make_dataset(corpora.sample_dataset("train"), sample_tokenizer,
                                    batch_tokens=512, max_length=32, seed=0)
    taken = list(dataset.take(16).as_numpy_iterator())
    rows = max(len(labels) for _, labels in taken)
    batches = {"steps": STEPS, "count": len(taken)}
    for i, (inputs, labels) in enumerate(taken):  # one shape: one compiled train step
        batches.update({f"source_{i}": _padded(inputs["source_ids"], (rows, 32)),
                        f"target_{i}": _padded(inputs["target_ids"], (rows, 32)),
                        f"labels_{i}": _padded(labels, (rows, 32))})
    np.savez(work / "batches.npz", **batches)

    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "backend_check.py"),
                           str(work)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return _tensorflow_results(model, given), dict(np.load(work / "outputs.npz"))


def test_runs_on_jax_without_tensorflow(jax_run):
    _, jax = jax_run
    assert str(jax["backend"]) == "jax"
    assert not bool(jax["tensorflow_imported"])


def test_forward_loss_and_gradient_equal_tensorflows(jax_run):
    ours, jax = jax_run
    np.testing.assert_allclose(jax["logits"], ours["logits"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(float(jax["loss"]), ours["loss"], rtol=1e-6)
    paths = [str(jax[f"grad_path_{i}"]) for i in range(len(ours["grads"]))]
    assert sorted(paths) == sorted(ours["grads"])
    # Relative to the largest gradient: the key projections' biases have a zero gradient
    # (softmax is unchanged by adding one number to every score), so theirs is rounding.
    scale = max(np.abs(g).max() for g in ours["grads"].values())
    for i, path in enumerate(paths):
        np.testing.assert_allclose(jax[f"grad_{i}"] / scale, ours["grads"][path] / scale,
                                   atol=1e-5, err_msg=path)


def test_greedy_and_beam_search_equal_tensorflows(jax_run):
    ours, jax = jax_run
    np.testing.assert_array_equal(jax["greedy_sequences"], ours["greedy"]["sequences"].numpy())
    np.testing.assert_allclose(jax["greedy_scores"], ours["greedy"]["scores"].numpy(), atol=1e-5)
    np.testing.assert_array_equal(jax["beam_sequences"], ours["beam"]["sequences"].numpy())
    np.testing.assert_allclose(jax["beam_scores"], ours["beam"]["scores"].numpy(), atol=1e-5)


def test_fit_on_jax_lowers_the_loss(jax_run):
    _, jax = jax_run
    losses = jax["fit_losses"]
    assert len(losses) == STEPS and np.isfinite(losses).all()
    assert losses[-10:].mean() < losses[:10].mean() - 1.0, losses


def test_gradient_accumulation_weights_tokens_on_jax(jax_run):
    """As test_model's test of the same name, on JAX, whose trainer is stateless: an update
    accumulated over a short and a long micro-batch equals one update on both; Keras' plain
    averaging of the micro-batches differs (so the comparison can fail)."""
    _, jax = jax_run
    both = jax["update_both"]
    scale = np.abs(both).max()
    np.testing.assert_allclose(jax["update_accumulated"], both, rtol=1e-3, atol=1e-9)
    assert np.abs(jax["update_averaged"] - both).max() / scale > 0.05
