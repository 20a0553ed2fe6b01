"""Every benchmark in one command: training throughput and decoding speed against the keras-hub
peer, written to benchmarks/results/{training,decoding}.{json,md} and one summary.md.

    python -m benchmarks.run_all                  # tiny and base (about an hour on 2 CPU cores)
    python -m benchmarks.run_all --presets tiny   # minutes
"""

import argparse
import json
import pathlib

from benchmarks import decoding, training


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,base")
    parser.add_argument("--out_dir", default="benchmarks/results")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    presets = args.presets.split(",")
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = training.run(presets, steps=args.steps, repeats=args.repeats)
    (out / "training.json").write_text(json.dumps(train, indent=2))
    decode = decoding.run(presets, repeats=args.repeats)
    (out / "decoding.json").write_text(json.dumps(decode, indent=2))
    summary = ("## Training\n\n" + training.markdown(train) + "\n\n## Decoding\n\n"
               + decoding.markdown(decode) + "\n")
    (out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    main()
