"""Run in a fresh process by test_backends.py, under another Keras backend (`KERAS_BACKEND=jax`)
and with TensorFlow's import blocked: what a JAX-only machine does with this library.

    python backend_check.py WORK_DIR   (reads WORK_DIR/inputs.npz, model.weights.h5,
                                        config.json, batches.npz; writes WORK_DIR/outputs.npz)

Outputs: the model's logits, the loss and its gradient (per trainable variable, by path),
greedy and beam search on the same weights; the losses of a short `fit`; and the updates of
one token-weighted accumulated step and one plain step (see test_backends.py).
"""

import importlib.abc
import json
import pathlib
import sys
import time


class _BlockTensorFlow(importlib.abc.MetaPathFinder):
    """Makes `import tensorflow` fail as it does where TensorFlow is not installed."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by backend_check.py)")


sys.meta_path.insert(0, _BlockTensorFlow())

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402


def model_from(work, config):
    keras.utils.set_random_seed(0)
    model = kt.Transformer(kt.TransformerConfig.from_dict(config))
    model.build()
    model.load_weights(work / "model.weights.h5")
    return model


def loss_and_gradients(model, inputs, labels):
    import jax

    loss_fn = kt.LabelSmoothedCrossEntropy(pad_id=model.config.pad_id)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(values):
        logits, _ = model.stateless_call(values, non_trainable, inputs, training=False)
        return loss_fn(labels, logits)

    value, grads = jax.jit(jax.value_and_grad(loss))(trainable)
    return float(value), {v.path: np.asarray(g) for v, g in zip(model.trainable_variables, grads)}


def fit_losses(config, batches, steps):
    """Per-step losses of `model.fit` on numpy batches from the pipeline."""
    keras.utils.set_random_seed(1)
    model = kt.Transformer(kt.TransformerConfig.from_dict(config))
    model.compile(optimizer=kt.make_optimizer(kt.TransformerSchedule(config["d_model"], 30, 2.0)),
                  loss=kt.LabelSmoothedCrossEntropy(pad_id=model.config.pad_id))
    pairs = [({"source_ids": batches[f"source_{i}"], "target_ids": batches[f"target_{i}"]},
              batches[f"labels_{i}"]) for i in range(int(batches["count"]))]

    def forever():
        while True:
            yield from pairs

    losses = []
    logger = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
    model.fit(forever(), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[logger])
    return np.array(losses)


def one_update(config, optimizer, batches):
    """The change of every trainable weight after `fit` on `batches` (one update)."""
    keras.utils.set_random_seed(1)
    model = kt.Transformer(kt.TransformerConfig.from_dict(config))
    model.compile(optimizer=optimizer, loss=kt.LabelSmoothedCrossEntropy())
    model.build()
    start = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    model.fit((batch for batch in batches), steps_per_epoch=len(batches), epochs=1, verbose=0)
    return np.concatenate([(keras.ops.convert_to_numpy(w) - s).ravel()
                           for w, s in zip(model.trainable_weights, start)])


def _phase(name, began=[time.perf_counter()]):  # noqa: B006  (the clock of the whole run)
    print(f"{time.perf_counter() - began[0]:7.1f} s  {name}", file=sys.stderr, flush=True)


def main(work):
    work = pathlib.Path(work)
    _phase("imported")
    config = json.loads((work / "config.json").read_text())
    given = dict(np.load(work / "inputs.npz"))
    model = model_from(work, config)
    inputs = {"source_ids": given["source_ids"], "target_ids": given["target_ids"]}
    out = {"backend": np.array(keras.backend.backend()),
           "tensorflow_imported": np.array(any(m.startswith("tensorflow") for m in sys.modules))}
    out["logits"] = np.asarray(model(inputs, training=False))
    _phase("logits")
    loss, grads = loss_and_gradients(model, inputs, given["labels"])
    out["loss"] = np.array(loss)
    _phase("loss and gradient")
    for i, (path, grad) in enumerate(sorted(grads.items())):
        out[f"grad_path_{i}"], out[f"grad_{i}"] = np.array(path), grad
    settings = dict(bos_id=kt.config.BOS_ID, eos_id=kt.config.EOS_ID, max_extra=5)
    greedy = kt.greedy_search(model, given["source_ids"], **settings)
    _phase("greedy search")
    beam = kt.beam_search(model, given["source_ids"], beam_size=3, alpha=0.6, **settings)
    _phase("beam search")
    out.update(greedy_sequences=np.asarray(greedy["sequences"]),
               greedy_scores=np.asarray(greedy["scores"]),
               beam_sequences=np.asarray(beam["sequences"]),
               beam_scores=np.asarray(beam["scores"]))

    batches = dict(np.load(work / "batches.npz"))
    out["fit_losses"] = fit_losses(config, batches, int(batches["steps"]))
    _phase("fit")

    # An update accumulated over a short and a long micro-batch, against one on both.
    short, long = ([({"source_ids": given[f"{n}_source"], "target_ids": given[f"{n}_target"]},
                     given[f"{n}_labels"])] for n in ("short", "long"))
    both = [({"source_ids": given["both_source"], "target_ids": given["both_target"]},
             given["both_labels"])]
    out["update_both"] = one_update(config, kt.make_optimizer(1e-2, epsilon=1e3), both)
    out["update_accumulated"] = one_update(
        config, kt.make_optimizer(1e-2, epsilon=1e3, gradient_accumulation_steps=2),
        short + long)
    out["update_averaged"] = one_update(
        config, keras.optimizers.Adam(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e3,
                                      gradient_accumulation_steps=2), short + long)
    _phase("token-weighted accumulation")
    np.savez(work / "outputs.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1])
