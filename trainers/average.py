"""Average the last N checkpoints of a run (§6.1: 5 for base models, 20 for big).

    python -m trainers.average --model_dir runs/wmt14-base --last 5
    python -m trainers.average --model_dir runs/x --output avg.weights.h5 ckpt-a.weights.h5 ...
"""

import argparse
import logging
import pathlib
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m trainers.average",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints")
    parser.add_argument("--output", default=None,
                        help="default: <model_dir>/averaged.weights.h5")
    parser.add_argument("checkpoints", nargs="*", help="explicit checkpoint files instead")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from keras_transformer.config import ConfigError
    from keras_transformer import run_dir
    from trainers import checkpoints

    model_dir = pathlib.Path(args.model_dir)
    try:
        config, _ = run_dir.read_run_config(model_dir)
        paths = [pathlib.Path(p) for p in args.checkpoints] or \
            run_dir.list_checkpoints(model_dir / "checkpoints")[-args.last:]
        missing = [str(p) for p in paths if not p.exists()]
        if missing or not paths:
            raise FileNotFoundError(f"No such checkpoint(s): {missing or 'none found'}")
        model = run_dir.build_model(config)
        checkpoints.average_checkpoints(model, paths)
    except (FileNotFoundError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    output = pathlib.Path(args.output or model_dir / "averaged.weights.h5")
    run_dir.save_model_weights(model, output)
    print(f"Averaged {len(paths)} checkpoint(s) into {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
