"""A trained run's folder (`--model_dir`) and how later jobs rebuild the model from it:

    config.json          the TransformerConfig and the run's data settings
    vocab.model          the shared SentencePiece vocabulary
    checkpoints/         ckpt-<step>.weights.h5, the last K
    averaged.weights.h5  the average of the last N checkpoints (what evaluation translates with)
    best/                ckpt-<step>.weights.h5 and best.json: the best validation step (and
                         export/ with --export_on_best)
    backup/<worker>/     the training state (weights, optimizer, input position) of the last
                         two backups, for resumption after a kill; time.json, the time budget
    logs/                TensorBoard: train/ and validation/ (Keras), eval/ (validation loss,
                         perplexity, BLEU and chrF at the global step)
    eval/                step-<step>.txt, the validation sentences translated during training,
                         and scores.jsonl
    translations/        <split>.txt, and results.json with BLEU/chrF
"""

import json
import os
import pathlib
import tempfile

import keras

from keras_transformer.config import ConfigError, TransformerConfig
from keras_transformer.model import Transformer
from keras_transformer.tokenizer import Tokenizer

CHECKPOINT_GLOB = "ckpt-*.weights.h5"


def checkpoint_path(directory, step):
    """checkpoints/ckpt-<step>.weights.h5 under `directory`."""
    return pathlib.Path(directory) / f"ckpt-{step:08d}.weights.h5"


def list_checkpoints(directory):
    """Checkpoint files in `directory`, oldest step first."""
    return sorted(pathlib.Path(directory).glob(CHECKPOINT_GLOB))


def write_atomically(path, write):
    """Has `write(temporary_path)` write the file, then renames it to `path`: a run killed
    while writing leaves the previous file (or none), never a truncated one. The temporary
    name is hidden (a leading dot) and keeps the suffixes Keras checks (.weights.h5)."""
    path = pathlib.Path(path)
    stem, dot, suffixes = path.name.partition(".")
    temporary = path.with_name(f".{stem}.partial{dot}{suffixes}")
    write(temporary)
    os.replace(temporary, path)
    return path


def write_text_atomically(path, text):
    """Writes `text` (UTF-8) to `path` through `write_atomically`."""
    return write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def write_run_config(model_dir, config, settings):
    """Writes config.json: the model's `config` and the run's `settings` (a dict)."""
    path = pathlib.Path(model_dir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps({"model": config.to_dict(), "run": settings},
                                           indent=2))


def read_run_config(model_dir):
    """(TransformerConfig, run settings dict) from config.json."""
    path = pathlib.Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {model_dir} a trained model_dir?")
    data = json.loads(path.read_text())
    return TransformerConfig.from_dict(data["model"]), data["run"]


def check_same_shape(model_dir, config):
    """Refuses (ConfigError) a `config` whose weights would not fit the model that
    `model_dir` already holds, instead of overwriting its config.json."""
    path = pathlib.Path(model_dir) / "config.json"
    if not path.exists():
        return
    existing, _ = read_run_config(model_dir)
    differences = existing.shape_differences(config)
    if differences:
        listed = ", ".join(f"{name} {theirs} (it has {mine})" for name, mine, theirs in differences)
        raise ConfigError(
            f"--model_dir {model_dir} holds a model of another shape: this run asks for "
            f"{listed}. Use a new --model_dir, or continue that run with its own settings: "
            f"--config {path}.")


def load_tokenizer(model_dir):
    """The run's shared vocabulary (vocab.model)."""
    return Tokenizer.load(pathlib.Path(model_dir) / "vocab.model")


def build_model(config):
    """A built `Transformer` of `config`, with fresh weights."""
    model = Transformer(config)
    model.build()
    return model


def averaged_or_newest_weights(model_dir):
    """The averaged weights if present, else the newest checkpoint."""
    model_dir = pathlib.Path(model_dir)
    averaged = model_dir / "averaged.weights.h5"
    if averaged.exists():
        return averaged
    found = list_checkpoints(model_dir / "checkpoints")
    if not found:
        raise FileNotFoundError(f"No weights in {model_dir} (no averaged.weights.h5, no "
                                "checkpoints/ckpt-*.weights.h5).")
    return found[-1]


def save_model_weights(model, path):
    """Writes `model`'s own weights to `path` (a .weights.h5 file), leaving out its
    optimizer's state: checkpoints, best/ and averaged weights are read to translate, average
    and export, and Adam's two moments would triple them. Only the backups
    (trainers/backup.py) keep the optimizer, to resume training. Returns `path`."""
    optimizer = getattr(model, "optimizer", None)
    skip = [optimizer] if optimizer is not None else None
    return write_atomically(path, lambda temporary: keras.saving.save_weights(
        model, temporary, objects_to_skip=skip))


def load_weights(model, path):
    """Loads the weights file `path` into `model`; a file written before keras-transformer 0.2
    (each sub-layer's norm and dropout in a `Residual` layer) is read through a copy laid out
    as today (its dropout seeds are stored in another order, so a run resumed from an old
    backup draws other dropout masks than the old version would have). Refuses (ConfigError) a
    file whose layers do not match."""
    try:
        with tempfile.TemporaryDirectory() as folder:
            current = pathlib.Path(folder) / pathlib.Path(path).name
            model.load_weights(current if _copy_as_current_layout(path, current) else path)
    except (ValueError, KeyError) as error:
        raise ConfigError(
            f"{path} does not fit this model's layers ({str(error)[:300]}): it was written for "
            "another model shape, or by an early keras-transformer whose layers were laid out "
            "differently; read it with that version, or train anew.") from error


def _copy_as_current_layout(path, copy):
    """Writes `path` to `copy` with the pre-0.2 groups "<sub-layer>_residual/norm" and
    ".../drop_output" renamed "<sub-layer>_norm" and "<sub-layer>_dropout" (the encoder's
    "attention_residual" being its self-attention's). False, writing nothing, for a file
    already laid out as today (or not a weights file)."""
    import h5py

    try:
        with h5py.File(path, "r") as old:
            names = []
            old.visit(names.append)
            if not any(part.endswith("_residual") for name in names for part in name.split("/")):
                return False
            with h5py.File(copy, "w") as new:
                new.attrs.update(old.attrs)
                for name in names:
                    target = _current_name(name)
                    if target is None:
                        continue
                    item = old[name]
                    if isinstance(item, h5py.Dataset):
                        new.create_dataset(target, data=item[()])
                    else:
                        new.require_group(target)
                    new[target].attrs.update(item.attrs)
    except OSError:
        return False
    return True


def _current_name(name):
    """A pre-0.2 weights-file group's name today (None: the `Residual` layer's own, empty)."""
    parts = name.split("/")
    for i, part in enumerate(parts):
        if part.endswith("_residual"):
            sublayer = part.removesuffix("_residual")
            sublayer = "self_attention" if sublayer == "attention" else sublayer
            inner = parts[i + 1] if i + 1 < len(parts) else "vars"
            if inner not in ("norm", "drop_output"):
                return None
            suffix = "_norm" if inner == "norm" else "_dropout"
            return "/".join(parts[:i] + [sublayer + suffix] + parts[i + 2:])
    return name


def load_trained(model_dir, weights=None):
    """(model, tokenizer, run settings) from a model_dir, with the averaged (else the newest)
    weights loaded."""
    config, settings = read_run_config(model_dir)
    model = build_model(config)
    load_weights(model, weights or averaged_or_newest_weights(model_dir))
    return model, load_tokenizer(model_dir), settings
