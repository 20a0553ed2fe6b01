"""A trained run as a keras-hub preset, and a keras-hub preset as a run folder.

    python -m export.keras_hub --model_dir RUN --preset_dir DIR [--weights FILE]
    python -m export.keras_hub --preset_dir DIR --to_model_dir RUN

The first writes what `keras_hub.models.Seq2SeqLM.save_to_preset` writes (metadata.json,
config.json, model.weights.h5, tokenizer.json with the vocabulary under assets/,
preprocessor.json, task.json) from the run's averaged weights (or `--weights`); after
`import keras_transformer`, `keras_hub.models.Seq2SeqLM.from_preset(DIR)` loads it. The second
turns a preset (one fine-tuned and saved by keras-hub, say) into a run folder (config.json,
vocab.model, averaged.weights.h5) that `trainers.translate`, `export.saved_model` and
`export.ctranslate2` read.
"""

import argparse
import json
import pathlib
import sys


def run_to_preset(model_dir, preset_dir, weights=None, encoder_sequence_length=256):
    """Writes the run in `model_dir` as a keras-hub preset in `preset_dir`; returns the task.
    keras-hub pads every input to the preprocessor's lengths: sources to
    `encoder_sequence_length` pieces (cut there, EOS kept; at most the model's max_length
    less `BeamSearch.max_extra`), outputs to that plus max_extra."""
    from keras_transformer import hub, run_dir

    model_dir = pathlib.Path(model_dir)
    config, _ = run_dir.read_run_config(model_dir)
    tokenizer = run_dir.load_tokenizer(model_dir)
    backbone = hub.TransformerBackbone(config)
    run_dir.load_weights(backbone.transformer,
                         weights or run_dir.averaged_or_newest_weights(model_dir))
    max_extra = hub.BeamSearch().max_extra
    source_length = min(encoder_sequence_length, config.max_length - max_extra)
    preprocessor = hub.TransformerSeq2SeqLMPreprocessor(
        hub.TransformerTokenizer(proto=tokenizer.model_proto),
        encoder_sequence_length=source_length, decoder_sequence_length=source_length + max_extra)
    task = hub.TransformerSeq2SeqLM(backbone, preprocessor)
    task.save_to_preset(str(preset_dir))
    return task


def preset_to_run(preset_dir, model_dir):
    """Writes the keras-hub preset in `preset_dir` as a run folder `model_dir`; returns it.
    A backbone with LoRA enabled is merged first (its kernels become W + A B)."""
    import keras_hub

    import keras_transformer  # noqa: F401  (registers the classes from_preset looks up)
    from keras_transformer import run_dir
    from keras_transformer.config import ConfigError
    from keras_transformer.hub import TransformerBackbone

    task = keras_hub.models.Seq2SeqLM.from_preset(str(preset_dir))
    if not isinstance(task.backbone, TransformerBackbone):
        raise ConfigError(f"{preset_dir} holds a {type(task.backbone).__name__}, not a "
                          "keras_transformer TransformerBackbone.")
    model_dir = pathlib.Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    transformer = task.backbone.transformer
    run_dir.write_run_config(model_dir, transformer.config,
                             {"converted_from_preset": str(preset_dir)})
    proto = task.preprocessor.tokenizer.proto
    (model_dir / "vocab.model").write_bytes(proto if isinstance(proto, bytes) else
                                            pathlib.Path(proto).read_bytes())
    run_dir.save_model_weights(transformer, model_dir / "averaged.weights.h5")
    return model_dir


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m export.keras_hub", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", default=None, help="a trained run's model_dir")
    parser.add_argument("--preset_dir", required=True, help="the keras-hub preset folder")
    parser.add_argument("--weights", default=None, help="default: the run's averaged weights")
    parser.add_argument("--encoder_sequence_length", type=int, default=256,
                        help="the preset's source length (longer sources are cut)")
    parser.add_argument("--to_model_dir", default=None,
                        help="convert --preset_dir into this run folder instead")
    args = parser.parse_args(argv)
    if (args.model_dir is None) == (args.to_model_dir is None):
        parser.error("give --model_dir (run -> preset) or --to_model_dir (preset -> run)")

    from keras_transformer.config import ConfigError

    try:
        if args.to_model_dir:
            target = preset_to_run(args.preset_dir, args.to_model_dir)
            print(f"Wrote the run folder {target} (config.json, vocab.model, "
                  "averaged.weights.h5)")
        else:
            run_to_preset(args.model_dir, args.preset_dir, args.weights,
                          args.encoder_sequence_length)
            files = sorted(p.name for p in pathlib.Path(args.preset_dir).iterdir())
            print(f"Wrote the keras-hub preset {args.preset_dir}: {', '.join(files)}")
            print(json.dumps({"load_with": "import keras_hub, keras_transformer; "
                              f"keras_hub.models.Seq2SeqLM.from_preset({args.preset_dir!r})"}))
    except (FileNotFoundError, ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
