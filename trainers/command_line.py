"""The trainer's command line: one flag per `RunSettings` field (trainers/settings.py) and per
`TransformerConfig` field, and --config files of flag values. Imports neither TensorFlow nor
Keras, so `--help` answers at once."""

import argparse
import atexit
import dataclasses
import json
import os
import pathlib
import sys

from trainers import settings as run_settings

PER_DATASET = "default per --dataset: "


def exit_skipping_teardown(code):
    """Ends a command-line job with exit status `code`: runs the exit handlers (logging's
    flush among them) and flushes stdout and stderr, then leaves without the interpreter's
    teardown of TensorFlow's modules and objects, which takes about 2 s on 2 cores and writes
    nothing: every file of a run is written and closed, and every summary flushed, before
    `main` returns. For `if __name__ == "__main__"` only; the jobs run no threads of their own."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _per_dataset(key):
    """`--help` text for a default that depends on --dataset."""
    values = {name: defaults.get(key) for name, defaults in run_settings.DATASET_DEFAULTS.items()}
    return PER_DATASET + ", ".join(f"{name} {value}" for name, value in values.items())


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' layout and shows each flag's default after its help."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


def build_parser(description=None):
    """The command line: the flags of `RunSettings`, grouped as --help shows them, with the
    model group's TransformerConfig fields after --preset."""
    parser = argparse.ArgumentParser(prog="python -m trainers.wmt", description=description,
                                     formatter_class=_HelpFormatter)
    groups = {}
    for field in run_settings.FLAGS:
        name = field.metadata["group"]
        if name not in groups:
            groups[name] = parser if name is None else parser.add_argument_group(name)
        _add_flag(groups[name], field)
    _model_flags(groups[run_settings.MODEL], run_settings.light_config())
    return parser


def _add_flag(group, field):
    """`--<field.name>` (and its old name, if it was renamed) for a `RunSettings` field."""
    options = dict(field.metadata["argparse"])
    help_text = field.metadata["help"]
    if field.name in run_settings.PER_DATASET_SETTINGS:
        help_text += "; " + _per_dataset(field.name)
    kind, is_list = run_settings.flag_type(field)
    if kind is bool:
        options["action"] = "store_true"
    else:
        options["type"] = kind
        if is_list:
            options["nargs"] = "+"
    names = [f"--{field.name}"] + [f"--{old}" for old, new in run_settings.RENAMED.items()
                                   if new == field.name]
    group.add_argument(*names, dest=field.name, default=field.default, help=help_text,
                       **options)


def _model_flags(model, config):
    """One flag per TransformerConfig field (`config`: keras_transformer/config.py)."""
    for field in dataclasses.fields(config.TransformerConfig):
        kind = run_settings.flag_type(field)[0]
        kind = _bool if kind is bool else kind
        choices = ("sinusoidal", "learned") if field.name == "position" else None
        # A bare boolean flag (`--norm_first`) means true; `--norm_first false` also works.
        bare = dict(nargs="?", const=True) if kind is _bool else {}
        by_preset = ", ".join(f"{name} {values.get(field.name, field.default)}"
                              for name, values in config.PRESETS.items())
        dataset_default = {name: d[field.name]
                           for name, d in run_settings.DATASET_DEFAULTS.items()
                           if field.name in d}
        note = f"default: the preset's ({by_preset})"
        if dataset_default:
            note += "; " + ", ".join(f"--dataset {n} {v}" for n, v in dataset_default.items())
        model.add_argument(f"--{field.name}", type=kind, default=None, choices=choices,
                           help=f"{config.FIELD_HELP[field.name]}; {note}", **bare)


def config_file_arguments(path, parser):
    """The flags a --config file sets, as command-line words: a .yaml or .json mapping of flag
    names (without --) to values, or a run's own config.json ({"model": ..., "run": ...}).
    A file that cannot be used ends the program with `parser.error` naming it."""
    path = pathlib.Path(path)
    if not path.exists():
        parser.error(f"--config {path}: no such file.")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as error:  # yaml.YAMLError, json.JSONDecodeError
        parser.error(f"--config {path}: not valid {path.suffix[1:] or 'JSON'}: {error}")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values.")
    if set(values) == {"model", "run"}:  # a run's own config.json
        values = {**values["run"], **values["model"]}
        for key in run_settings.RUN_ONLY:
            values.pop(key, None)
    values = {run_settings.RENAMED.get(key, key): value for key, value in values.items()}
    flags = {action.dest: action for action in parser._actions}
    unknown = sorted(set(values) - set(flags) - {"help"})
    if unknown:
        parser.error(f"--config {path}: unknown keys {unknown}; the keys are the flags' names "
                     "without -- (see --help).")
    words = []
    for key, value in values.items():
        action = flags[key]
        if value is None or key == "config":
            continue
        if action.nargs == 0:  # store_true
            if value:
                words.append(f"--{key}")
            continue
        values_given = value if isinstance(value, list) else [value]
        words += [f"--{key}"] + [str(v).lower() if isinstance(v, bool) else str(v)
                                 for v in values_given]
    return words


def parse_arguments(argv=None, description=None):
    """(args, given): the parsed flags, with a --config file's values under the command
    line's, and the names of the flags the file or the command line set."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(description)
    first = parser.parse_args(argv)
    words = (config_file_arguments(first.config, parser) if first.config else []) + argv
    args = parser.parse_args(words)
    for action in parser._actions:  # which flags were given: parse again without defaults
        action.default = argparse.SUPPRESS
    given = set(vars(parser.parse_args(words)))
    return args, given
