"""Training speed where users feel it: `python -m trainers.wmt` run exactly as a user runs it
(a subprocess, its own flags), against the plain keras-hub loop a user would write instead
(benchmarks/keras_hub_loop.py), on the same corpus, vocabulary, token budget, dimensions and
schedule, for the same wall-clock each, alternated.

    python -m benchmarks.end_to_end [--corpus sample|natural|news] [--minutes 5] [--repeats 1]
        [--precision float32] [--train_files train.tsv --test_files test.tsv]
        [--out benchmarks/results/end_to_end_<corpus>.json]

Per run: real target tokens per second (tracing excluded), steps, the share of the batch budget
that is real target tokens, the final training loss (mean over the last epoch or 100 steps)
and greedy BLEU on the first `--eval_sentences` held-out sentences (the trainer: the last
checkpoint, no averaging, beam 1, no length penalty). `sample` is the embedded sample corpus
(what the quick start trains on); `natural` joins sample sentences into pairs of natural,
WMT-like lengths (1 to 8 sentences, mean about 27 words) and trains through `--dataset files`;
`news` is real text (../shared/corpora/en-de-news: news and Tatoeba sentences, newstest2020 as
the held-out split), read where it lies.
The CPU model, its vector flags and the float32 matmul peak are printed beside the figures,
each run's CPU use (all its threads, over the timed training) beside its tokens/s, and the
matmul floor of ours' batches (the fastest any trainer could go with them here) beside both.
"""

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The corpus settings: the sample corpus as the quick start trains on it; the natural-length
# corpus at the size the speed issue measured (tiny, vocabulary 8,000, 4,000 tokens a batch).
CORPORA = {
    "sample": dict(vocab_size=2000, batch_tokens=2048, max_length=64, warmup_steps=200,
                   lr_scale=0.5),
    "natural": dict(vocab_size=8000, batch_tokens=4000, max_length=128, warmup_steps=400,
                    lr_scale=0.5),
    # Real text: ../shared/corpora/en-de-news (news and Tatoeba), at the size the speed issue
    # measured it (tiny, vocabulary 8,000, 4,000 tokens a batch).
    "news": dict(vocab_size=8000, batch_tokens=4000, max_length=128, warmup_steps=400,
                 lr_scale=0.5),
}
# Where the real EN-DE corpus lies: --news_dir, else $KT_EN_DE_NEWS, else the shared folder
# beside the checkout. It is read from there, never copied.
NEWS_DIR = os.environ.get("KT_EN_DE_NEWS", str(ROOT.parent / "shared/corpora/en-de-news"))


def news_corpus(directory):
    """{split: [english file, german file]} of the real corpus in `directory`."""
    directory = pathlib.Path(directory)
    files = {split: [directory / f"{name}.en.gz", directory / f"{name}.de.gz"]
             for split, name in (("train", "train"), ("test", "test"))}
    missing = [str(p) for paths in files.values() for p in paths if not p.exists()]
    if missing:
        raise SystemExit(f"--corpus news: {', '.join(missing)} not found; give the corpus "
                         "folder with --news_dir or $KT_EN_DE_NEWS.")
    return files


# The CPU flags that decide matmul speed and what --precision auto picks, printed beside figures.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def hardware():
    """CPU model, its flags that matter for matmul speed, and the float32 matmul peak."""
    from benchmarks.training import matmul_peak
    from trainers.precision import cpu_flags, cpu_model

    import tensorflow as tf

    flags = cpu_flags()
    return {"cpu": cpu_model(), "cores": os.cpu_count(),
            "flags": [f for f in VECTOR_FLAGS if f in flags],
            "matmul_peak_gflops_float32": matmul_peak(tf.float32),
            "tensorflow": tf.__version__}


def describe_hardware(h):
    """`hardware()`'s figures as the first words of a results table's header line."""
    return (f"{h['cpu']}, {h['cores']} cores, flags {' '.join(h['flags'])}; float32 matmul peak "
            f"{h['matmul_peak_gflops_float32']:.0f} GFLOP/s; TensorFlow {h['tensorflow']}")


def trainer_batches(corpus_args):
    """(config, settings, batches): the model configuration and the training batches that
    `python -m trainers.wmt corpus_args` builds (its vocabulary from the shared cache)."""
    import keras_transformer as kt
    from trainers import run_data, wmt

    config, settings = wmt.resolve_settings(wmt.build_parser().parse_args(corpus_args))
    tokenizer = run_data.get_tokenizer(settings, config, tempfile.mkdtemp())
    config = kt.TransformerConfig.preset(settings.preset, **{
        **config.to_dict(), "vocab_size": tokenizer.vocab_size})
    return config, settings, run_data.training_batches(settings, config, tokenizer, 1, False,
                                                       None)


def matmul_floor_of(config, batches, precision):
    """(seconds, real target tokens) a step on average over `batches` (source and label
    arrays) if the step were only its matrix products (benchmarks.training.matmul_floor), in
    the compute dtype of `precision`."""
    import tensorflow as tf

    from benchmarks.training import matmul_floor

    dtype = tf.bfloat16 if "bfloat16" in precision else (
        tf.float16 if "float16" in precision else tf.float32)
    floors = [matmul_floor(config, *inputs["source_ids"].shape, labels.shape[1], dtype,
                           repeats=3) for inputs, labels in batches]
    return (statistics.mean(floors),
            statistics.mean(float((labels != 0).sum()) for _, labels in batches))


def floor_tokens_per_s(corpus_args, precision, count=8):
    """Real target tokens per second at the matmul floor, on `count` of the trainer's own
    batches for this corpus (after as many more, so the shuffle has mixed): the fastest any
    trainer could go on this machine with these batches."""
    from trainers.precision import choose_precision

    import tensorflow as tf

    config, _, batches = trainer_batches(corpus_args + ["--preset", "tiny"])
    chosen, _ = choose_precision(precision, tf.distribute.get_strategy())
    sample = list(batches.skip(count).take(count).as_numpy_iterator())
    seconds, tokens = matmul_floor_of(config, sample, chosen)
    return tokens / seconds


def natural_corpus(directory, seed=0):
    """Train and test TSVs of sample sentences joined 1 to 8 at a time (mean about 3.5, as
    long as a WMT sentence), source and target joined alike so each line stays a translation."""
    from keras_transformer.data import sample_corpus

    rng = random.Random(seed)
    paths = {}
    for split in ("train", "test"):
        pairs, lines = sample_corpus.sample_pairs(split), []
        index = 0
        while index < len(pairs):
            count = min(8, max(1, round(rng.lognormvariate(1.1, 0.6))))
            chunk = pairs[index:index + count]
            index += count
            lines.append(" ".join(s for s, _ in chunk) + "\t" + " ".join(t for _, t in chunk))
        paths[split] = pathlib.Path(directory) / f"natural.{split}.tsv"
        paths[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {split: [path] for split, path in paths.items()}


def prepare_vocabulary(corpus_args, model_dir):
    """The vocabulary the trainer will use (trained once and cached, as the trainer does)."""
    from trainers import run_data, wmt

    parser = wmt.build_parser()
    config, settings = wmt.resolve_settings(parser.parse_args(corpus_args))
    tokenizer = run_data.get_tokenizer(settings, config, pathlib.Path(model_dir))
    return tokenizer.save(pathlib.Path(model_dir) / "benchmark-vocab.model")


def timed_training_flags(minutes):
    """The trainer's flags for a benchmark run: `minutes` of training (the step count out of
    reach), a backup every 100 steps, and no validation loss or BLEU during training, as the
    keras-hub loop."""
    return ["--train_minutes", str(minutes), "--train_steps", "1000000",
            "--validate_every_steps", "100", "--no_validation", "--eval_every_steps", "0"]


def run_ours(corpus_args, settings, args, work):
    model_dir = work / f"ours-{random.random():.6f}"
    command = [sys.executable, "-m", "trainers.wmt", *corpus_args, "--preset", "tiny",
               "--precision", args.precision, *timed_training_flags(args.minutes),
               "--average_last", "1", "--beam_size", "1", "--alpha", "0", "--eval_splits", "test",
               "--eval_max_sentences", str(args.eval_sentences), "--no_export",
               "--model_dir", str(model_dir), "--verbose", "2"]
    if args.xla:
        command += ["--jit_compile", "--static_batches"]
    command += args.ours_args.split()
    print("$", " ".join(command[1:]), flush=True)
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"the trainer failed:\n{result.stderr[-4000:]}")
    summary = json.loads((model_dir / "train_summary.json").read_text())
    scores = json.loads((model_dir / "translations/results.json").read_text())["test"]
    return {"steps": summary["steps"], "target_tokens_per_s": summary["tokens_per_second"],
            "real_token_share": summary["real_token_share"], "cpu_use": summary["cpu_use"],
            "final_loss": summary["final_loss"], "greedy_bleu": scores["bleu"],
            "train_seconds": summary["fit_seconds"]}


def run_peer(settings, vocab, files, args, work):
    out = work / f"peer-{random.random():.6f}.json"
    command = [sys.executable, "-m", "benchmarks.keras_hub_loop", "--vocab", str(vocab),
               "--batch_tokens", str(settings["batch_tokens"]),
               "--max_length", str(settings["max_length"]),
               "--warmup_steps", str(settings["warmup_steps"]),
               "--lr_scale", str(settings["lr_scale"]), "--precision", args.precision,
               "--minutes", str(args.minutes), "--eval_sentences", str(args.eval_sentences),
               "--out", str(out)]
    if files:
        command += ["--train_files", *map(str, files["train"]),
                    "--test_files", *map(str, files["test"])]
    print("$", " ".join(command[1:]), flush=True)
    env = dict(os.environ)
    if not args.peer_bfc:  # what a keras-hub user runs: TensorFlow's default CPU allocator
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "false"
    # oneDNN's own default, which importing keras_transformer would raise (the loop imports it
    # for the preset's sizes and the learning-rate schedule).
    env.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    if result.returncode:
        raise RuntimeError(f"the keras-hub loop failed:\n{result.stderr[-4000:]}")
    # Its first hypotheses beside their references: a peer that does not translate makes
    # every ratio beside it meaningless.
    print("\n".join(line for line in result.stdout.splitlines()
                    if line.startswith(("source:", "reference:", "hypothesis:"))), flush=True)
    return json.loads(out.read_text())


def over(a, b):
    return f"{a / b:.2f}" if b else "-"


def markdown(report):
    h = report["hardware"]
    lines = [f"{describe_hardware(h)}; "
             f"corpus {report['corpus']}, {report['precision']}, {report['minutes']:g} minutes "
             f"each, batch budget {report['settings']['batch_tokens']} tokens"
             + (f"; ours with {report['ours_args']}" if report["ours_args"] else ""),
             "",
             "| run | real target tokens/s | CPU use | steps | real-token share of the budget "
             "| final training loss | greedy BLEU |",
             "|---|---|---|---|---|---|---|"]
    for kind, runs in (("ours (python -m trainers.wmt)", report["ours"]),
                       ("plain keras-hub loop", report["peer"])):
        for r in runs:
            cpu = f"{100 * r['cpu_use']:.0f}%" if "cpu_use" in r else "-"
            lines.append(f"| {kind} | {r['target_tokens_per_s']:,.0f} | {cpu} | {r['steps']} "
                         f"| {100 * r['real_token_share']:.1f}% | {r['final_loss']:.3f} "
                         f"| {r['greedy_bleu']:.2f} |")
    floor = statistics.median(report["floor_tokens_per_s"])
    ours = statistics.median(r["target_tokens_per_s"] for r in report["ours"])
    peer = statistics.median(r["target_tokens_per_s"] for r in report["peer"])
    lines += ["", f"ours/peer, median tokens/s: **{report['ratio']:.2f}x**. The matmul floor "
              f"(the step's matrix products alone, on ours' batches, measured before each pair): "
              f"{floor:,.0f} real target tokens/s; time per real target token over the "
              f"floor's: ours {over(floor, ours)}, the peer {over(floor, peer)}. CPU use is of "
              "all cores, over the timed training (first step excluded)."]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="sample")
    parser.add_argument("--train_files", nargs="+", default=None,
                        help="a TSV or two aligned files to use instead of --corpus")
    parser.add_argument("--test_files", nargs="+", default=None)
    parser.add_argument("--news_dir", default=NEWS_DIR,
                        help="--corpus news: the en-de-news folder (default $KT_EN_DE_NEWS or "
                             "../shared/corpora/en-de-news)")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--xla", action="store_true", help="ours with --jit_compile")
    parser.add_argument("--eval_sentences", type=int, default=500)
    parser.add_argument("--ours_args", default="",
                        help="more trainer flags for ours, e.g. '--batching packed'")
    parser.add_argument("--peer_bfc", action="store_true",
                        help="give the keras-hub loop the BFC allocator too")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    settings = dict(CORPORA[args.corpus])
    work = pathlib.Path(tempfile.mkdtemp(prefix="kt-end-to-end-"))
    files = None
    if args.train_files:
        files = {"train": args.train_files, "test": args.test_files}
    elif args.corpus == "natural":
        files = natural_corpus(work)
    elif args.corpus == "news":
        files = news_corpus(args.news_dir)
    common = ["--vocab_size", str(settings["vocab_size"]),
              "--batch_tokens", str(settings["batch_tokens"]),
              "--max_train_length", str(settings["max_length"]),
              "--max_length", str(max(settings["max_length"], 256)),
              "--warmup_steps", str(settings["warmup_steps"]),
              "--lr_scale", str(settings["lr_scale"])]
    if files:
        corpus_args = ["--dataset", "files", "--train_files", *map(str, files["train"]),
                       "--test_files", *map(str, files["test"]), *common]
    else:
        corpus_args = ["--dataset", "sample", *common]
    report = {"corpus": " ".join(args.train_files) if args.train_files else args.corpus, "precision": args.precision,
              "ours_args": args.ours_args,
              "minutes": args.minutes, "settings": settings, "hardware": hardware(),
              "ours": [], "peer": [], "floor_tokens_per_s": []}
    vocab = prepare_vocabulary(corpus_args + ["--preset", "tiny"], work)
    for _ in range(args.repeats):  # alternate, so drift hits both alike
        report["floor_tokens_per_s"].append(floor_tokens_per_s(corpus_args, args.precision))
        print(f"matmul floor: {report['floor_tokens_per_s'][-1]:,.0f} real target tokens/s",
              flush=True)
        report["ours"].append(run_ours(corpus_args, settings, args, work))
        print("ours:", report["ours"][-1], flush=True)
        report["peer"].append(run_peer(settings, vocab, files, args, work))
        print("peer:", report["peer"][-1], flush=True)
    report["ratio"] = (statistics.median(r["target_tokens_per_s"] for r in report["ours"])
                       / max(statistics.median(r["target_tokens_per_s"] for r in report["peer"]), 1e-9))
    from benchmarks import save

    suffix = "_" + "_".join(args.ours_args.replace("--", "").split()) if args.ours_args else ""
    save(args.out or f"benchmarks/results/end_to_end_{args.corpus}_{args.precision}{suffix}.json",
         report, markdown(report))


if __name__ == "__main__":
    main()
