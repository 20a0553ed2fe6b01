"""The output projection under mixed_bfloat16, both ways `SharedEmbedding.logits` computes
it: a bfloat16 product whose result is cast to float32 for the softmax, the loss and the
metrics (the default, as keras-hub's `ReversibleEmbedding` and tensor2tensor on TPU), against
x W^T in float32 (`float32_product=True`: x cast up, what the decoding steps use and what
training used before issue 22). The trainer's own model, loss, metrics, optimizer and batches
(benchmarks.step_profile.trainer_setup), the same initial weights and the same batches both
ways, trained in alternating rounds: step time and real target tokens/s (the speed half of
the decision, which only a CPU with AMX or AVX512-BF16, or a GPU, can give), and the
training loss over the same steps and a held-out loss after them (the numerics half, which
any CPU can give, emulated).

    python -m benchmarks.logits_precision [--corpus news|sample] [--steps 40] [--rounds 2]
        [--out benchmarks/results/logits_precision_<corpus>.json]
"""

import argparse
import functools
import os
import statistics
import time

from benchmarks.end_to_end import NEWS_DIR, describe_hardware, hardware

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("news", "sample"), default="news")
    parser.add_argument("--news_dir", default=NEWS_DIR)
    parser.add_argument("--steps", type=int, default=40, help="steps a way in each round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--held_out", type=int, default=8, help="batches for the held-out loss")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from benchmarks import save
    from benchmarks.step_profile import corpus_flags, trainer_setup

    corpus_args = corpus_flags(args.corpus, args.news_dir, "mixed_bfloat16")
    ways = {}
    for way in ("float32 product", "bfloat16 product"):
        keras.utils.set_random_seed(0)  # the same initial weights and dropout draws
        config, settings, model, batches = trainer_setup(corpus_args)
        if way == "float32 product":
            model.embedding.logits = functools.partial(model.embedding.logits,
                                                       float32_product=True)
        ways[way] = model
    total = args.steps * args.rounds
    fixed = list(batches.take(total + args.held_out).as_numpy_iterator())
    train, held_out = fixed[:total], fixed[total:]
    spec = batches.element_spec

    def stream(items):
        return tf.data.Dataset.from_generator(lambda: iter(items), output_signature=spec)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self.losses = [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))  # Keras' running mean over the epoch
            self.times.append(time.perf_counter() - self.start)

    runs = {way: {"step_s": [], "round_loss": []} for way in ways}
    for r in range(args.rounds):  # alternate, so that drift hits both alike
        chunk = train[r * args.steps:(r + 1) * args.steps]
        for way, model in ways.items():
            timer = Timer()
            model.fit(stream(chunk), steps_per_epoch=len(chunk), epochs=1, verbose=0,
                      callbacks=[timer])
            # The first round's first step traces: leave it out of the timing.
            runs[way]["step_s"] += timer.times[1:] if r == 0 else timer.times
            runs[way]["round_loss"].append(timer.losses[-1])
    real = float(np.mean([(labels != 0).sum() for _, labels in train]))
    for way, model in ways.items():
        result = model.evaluate(stream(held_out), steps=len(held_out), verbose=0,
                                return_dict=True)
        run = runs[way]
        run.update(median_step_s=statistics.median(run["step_s"]),
                   held_out_loss=float(result["loss"]))
        run["tokens_per_second"] = real / run["median_step_s"]
        del run["step_s"]
    report = {"hardware": hardware(), "corpus": args.corpus, "steps_per_round": args.steps,
              "rounds": args.rounds, "real_target_tokens_per_step": real, "ways": runs}
    save(args.out or f"benchmarks/results/logits_precision_{args.corpus}.json", report,
         markdown(report))


def markdown(report):
    h = report["hardware"]
    lines = [f"{describe_hardware(h)}; "
             f"tiny on the {report['corpus']} corpus, mixed_bfloat16, {report['rounds']} rounds "
             f"of {report['steps_per_round']} steps a way "
             f"({report['real_target_tokens_per_step']:,.0f} real target tokens a step)",
             "",
             "| logits product | step (median) | real target tokens/s | training loss, each "
             "round | held-out loss |",
             "|---|---|---|---|---|"]
    for way, r in report["ways"].items():
        losses = ", ".join(f"{x:.3f}" for x in r["round_loss"])
        lines.append(f"| {way} | {r['median_step_s']:.3f} s | {r['tokens_per_second']:,.0f} "
                     f"| {losses} | {r['held_out_loss']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
