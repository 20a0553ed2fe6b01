"""What a training run leaves in `--model_dir`, and how later jobs rebuild the model from it:

    config.json          the TransformerConfig and the run's data settings
    vocab.model          the shared SentencePiece vocabulary
    checkpoints/         ckpt-<step>.weights.h5, the last K
    averaged.weights.h5  the average of the last N checkpoints (what evaluation translates with)
    backup/              keras BackupAndRestore state (resumption after a kill)
    logs/                TensorBoard
    translations/        <split>.txt, and results.json with BLEU/chrF
"""

import json
import pathlib

import keras_transformer as kt
from keras_transformer.tokenizer import Tokenizer
from trainers import checkpoints


def write_run_config(model_dir, config, settings):
    path = pathlib.Path(model_dir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": config.to_dict(), "run": settings}, indent=2))


def read_run_config(model_dir):
    path = pathlib.Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {model_dir} a trained model_dir?")
    data = json.loads(path.read_text())
    return kt.TransformerConfig.from_dict(data["model"]), data["run"]


def load_tokenizer(model_dir):
    return Tokenizer.load(pathlib.Path(model_dir) / "vocab.model")


def build_model(config):
    model = kt.Transformer(config)
    model.build()
    return model


def best_weights(model_dir):
    """The averaged weights if present, else the newest checkpoint."""
    model_dir = pathlib.Path(model_dir)
    averaged = model_dir / "averaged.weights.h5"
    if averaged.exists():
        return averaged
    found = checkpoints.list_checkpoints(model_dir / "checkpoints")
    if not found:
        raise FileNotFoundError(f"No weights in {model_dir} (no averaged.weights.h5, no "
                                "checkpoints/ckpt-*.weights.h5).")
    return found[-1]


def load_trained(model_dir, weights=None):
    """(model, tokenizer, run settings) from a model_dir, with the best weights loaded."""
    config, settings = read_run_config(model_dir)
    model = build_model(config)
    model.load_weights(weights or best_weights(model_dir))
    return model, load_tokenizer(model_dir), settings
