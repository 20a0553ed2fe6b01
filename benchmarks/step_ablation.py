"""What a part of the training step costs here, as wall-clock: the trainer's model and batches
once as configured and once per variant with model settings changed (`dropout=0`,
`num_heads=8,key_dim=32`), `layer_norm=keras` (Keras' `LayerNormalization`, differentiated
by autodiff, in place of `kt.LayerNorm`), `add_and_norm=separate|compiled` (training's Add
& Norm as separate TensorFlow ops, or compiled by XLA under mixed_bfloat16 even where the
library keeps it separate: `layer_norm.compiles_add_and_norm`), `bias_gradient=keras` (the
Dense layers' bias gradients as TensorFlow computes them, where the library sums them by a
product: `dense.sums_bias_gradient_by_product`) or `attention_mask=select` (masked scores
selected, `where(mask, scores, MASKED_SCORE)`, where the library adds the mask as a bias:
`attention.scaled_dot_product_attention`), every model built in one
process and timed in alternating rounds so that the machine's drift hits all alike, beside
the step's matmul floor.

    python -m benchmarks.step_ablation [--corpus news|sample] [--precision float32]
        [--variants dropout=0 layer_norm=keras add_and_norm=compiled attention_mask=select ...]
        [--rounds 5]
        [--steps 8] [--out benchmarks/results/step_ablation_<corpus>_<precision>.json]

The profiler (`benchmarks.step_profile`) gives each op's time, but ops that run at once share
the cores and each looks slower than it is, so shares of op time do not say what removing a
part would save; the step's time with the part removed does.
"""

import argparse
import ast
import contextlib
import dataclasses
import os
import statistics
import time

from benchmarks.end_to_end import (NEWS_DIR, describe_hardware, hardware, matmul_floor_of,
                                   trainer_batches)
from benchmarks.step_profile import corpus_flags


def parse_variant(text):
    """"dropout=0,attention_dropout=0.1" -> {"dropout": 0, "attention_dropout": 0.1}."""
    overrides = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        try:
            overrides[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            overrides[key.strip()] = value.strip()
    return overrides


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("news", "sample"), default="news")
    parser.add_argument("--news_dir", default=NEWS_DIR)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--variants", nargs="+", default=["dropout=0"],
                        help="model settings (TransformerConfig fields) changed, one variant "
                             "per word: key=value[,key=value]; layer_norm=keras for Keras' "
                             "LayerNormalization; add_and_norm=separate|compiled for the Add & "
                             "Norm as separate ops or compiled by XLA; bias_gradient=keras for "
                             "TensorFlow's bias gradients; attention_mask=select for masked "
                             "scores selected instead of a bias added")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="steps per model and round")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import keras_transformer as kt
    from benchmarks import save
    from trainers import training

    from keras_transformer import attention, dense, stack
    from keras_transformer.masks import MASKED_SCORE

    @contextlib.contextmanager
    def keras_layer_norm():
        """Models built within use Keras' LayerNormalization (made in the layers' __init__)."""
        ours, stack.make_layer_norm = stack.make_layer_norm, (
            lambda epsilon, name, dtype: keras.layers.LayerNormalization(
                epsilon=epsilon, name=name, dtype=dtype))
        try:
            yield
        finally:
            stack.make_layer_norm = ours

    # The Add & Norm of each variant's norms, "separate" or "compiled" (on any machine), or
    # as the library decides: per norm, so that every trace of their steps (a retrace too)
    # follows it.
    chosen_add_and_norm = {}
    compiles = stack.compiles_add_and_norm

    def variant_compiles(x, dropout, norm, training):
        choice = chosen_add_and_norm.get(id(norm), "as configured")
        return choice != "separate" and compiles(x, dropout, norm, training,
                                                 where_faster_only=choice != "compiled")

    stack.compiles_add_and_norm = variant_compiles

    # The Dense layers of the variants with bias_gradient=keras (per layer, as above).
    keras_bias_gradient = set()
    sums_by_product = dense.sums_bias_gradient_by_product
    dense.sums_bias_gradient_by_product = (
        lambda layer: id(layer) not in keras_bias_gradient and sums_by_product(layer))

    @contextlib.contextmanager
    def selected_attention_mask():
        """Models traced within select their masked scores (the form before the bias)."""
        ours = attention.scaled_dot_product_attention

        def selecting(query, key, value, mask=None, drop_weights=None):
            if mask is None:
                return ours(query, key, value, None, drop_weights)
            d_k = query.shape[-1]
            query = query * keras.ops.cast(d_k**-0.5, query.dtype)
            scores = keras.ops.cast(keras.ops.einsum("...qd,...kd->...qk", query, key),
                                    "float32")
            weights = keras.ops.softmax(keras.ops.where(mask, scores, MASKED_SCORE), axis=-1)
            applied = weights if drop_weights is None else drop_weights(weights)
            return keras.ops.matmul(keras.ops.cast(applied, value.dtype), value), weights

        attention.scaled_dot_product_attention = selecting
        try:
            yield
        finally:
            attention.scaled_dot_product_attention = ours

    variants = {"as configured": {}, **{v: parse_variant(v) for v in args.variants}}
    norms = {name: overrides.pop("layer_norm", "ours") for name, overrides in variants.items()}
    if set(norms.values()) - {"ours", "keras"}:
        raise SystemExit("--variants: layer_norm=keras is the only other layer norm.")
    add_and_norms = {name: overrides.pop("add_and_norm", "as configured")
                     for name, overrides in variants.items()}
    if set(add_and_norms.values()) - {"as configured", "separate", "compiled"}:
        raise SystemExit("--variants: add_and_norm is separate or compiled.")
    bias_gradients = {name: overrides.pop("bias_gradient", "as configured")
                      for name, overrides in variants.items()}
    if set(bias_gradients.values()) - {"as configured", "keras"}:
        raise SystemExit("--variants: bias_gradient=keras is the only other bias gradient.")
    attention_masks = {name: overrides.pop("attention_mask", "as configured")
                       for name, overrides in variants.items()}
    if set(attention_masks.values()) - {"as configured", "select"}:
        raise SystemExit("--variants: attention_mask=select is the only other attention mask.")
    fields = {f.name for f in dataclasses.fields(kt.TransformerConfig)}
    unknown = sorted({key for overrides in variants.values() for key in overrides} - fields)
    if unknown:
        raise SystemExit(f"--variants: {', '.join(unknown)} is not a model setting; use "
                         f"TransformerConfig fields ({', '.join(sorted(fields))}).")
    config, settings, batches = trainer_batches(
        corpus_flags(args.corpus, args.news_dir, args.precision))
    keras.mixed_precision.set_global_policy(settings.precision)
    # The same batches for every model, after as many again so the shuffle has mixed.
    fixed = list(batches.skip(args.steps).take(args.steps).as_numpy_iterator())
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(fixed), output_signature=batches.element_spec).repeat()
    models = {}
    for name, overrides in variants.items():
        variant = dataclasses.replace(config, **overrides)
        schedule = kt.TransformerSchedule(variant.d_model, variant.warmup_steps,
                                          settings.lr_scale)
        with keras_layer_norm() if norms[name] == "keras" else contextlib.nullcontext():
            models[name] = training.compiled_model(settings, variant, schedule,
                                                   tf.distribute.get_strategy())
        chosen_add_and_norm.update((id(layer), add_and_norms[name])
                                   for layer in models[name]._flatten_layers()
                                   if isinstance(layer, keras.layers.LayerNormalization))
        if bias_gradients[name] == "keras":
            keras_bias_gradient.update(id(layer) for layer in models[name]._flatten_layers()
                                       if isinstance(layer, keras.layers.Dense))
        # The first fit traces the step: the attention mask's form is fixed then.
        with (selected_attention_mask() if attention_masks[name] == "select"
              else contextlib.nullcontext()):
            models[name].fit(dataset, steps_per_epoch=args.steps + 1, epochs=1, verbose=0)

    step_times = {name: [] for name in models}

    class Timer(keras.callbacks.Callback):
        def __init__(self, out):
            super().__init__()
            self.out = out

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])
            self.out.append(time.perf_counter() - self.start)

    rounds = []
    for round_ in range(args.rounds):
        for name, model in models.items():
            model.fit(dataset, steps_per_epoch=args.steps, epochs=1, verbose=0,
                      callbacks=[Timer(step_times[name])])
        rounds.append({name: statistics.median(t[-args.steps:])
                       for name, t in step_times.items()})
        print(f"round {round_ + 1}:", {k: round(v, 3) for k, v in rounds[-1].items()},
              flush=True)
    floor, real = matmul_floor_of(config, fixed, settings.precision)
    report = {"hardware": hardware(), "corpus": args.corpus, "precision": args.precision,
              "steps": args.steps, "rounds": rounds, "matmul_floor_s": floor,
              "real_target_tokens_per_step": real,
              "step_s": {name: statistics.median(t) for name, t in step_times.items()},
              "variants": variants, "layer_norms": norms, "add_and_norms": add_and_norms,
              "bias_gradients": bias_gradients, "attention_masks": attention_masks}
    save(args.out or f"benchmarks/results/step_ablation_{args.corpus}_{args.precision}.json",
         report, markdown(report))


def markdown(report):
    h = report["hardware"]
    base = report["step_s"]["as configured"]
    lines = [f"{describe_hardware(h)}; "
             f"tiny on the {report['corpus']} corpus, {report['precision']}, the trainer's own "
             f"batches ({report['real_target_tokens_per_step']:,.0f} real target tokens a "
             f"step); {len(report['rounds'])} alternating rounds of {report['steps']} steps",
             "", "| model | step (median) | against as configured | step / matmul floor "
             f"({report['matmul_floor_s']:.3f} s) | medians per round |", "|---|---|---|---|---|"]
    for name, step in report["step_s"].items():
        per_round = ", ".join(f"{r[name]:.3f}" for r in report["rounds"])
        lines.append(f"| {name} | {step:.3f} s | {step / base:.3f} | "
                     f"{step / report['matmul_floor_s']:.2f} | {per_round} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
