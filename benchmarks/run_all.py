"""Every benchmark in one command: training throughput and decoding speed against the keras-hub
peer, written to benchmarks/results/{training,decoding}.{json,md} and one summary.md.

    python -m benchmarks.run_all                  # tiny and base (about an hour on 2 CPU cores)
    python -m benchmarks.run_all --presets tiny   # minutes
"""

import argparse
import pathlib

from benchmarks import decoding, save, training


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,base")
    parser.add_argument("--out_dir", default="benchmarks/results")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    presets = args.presets.split(",")
    out = pathlib.Path(args.out_dir)
    train = training.run(presets, steps=args.steps, repeats=args.repeats)
    save(out / "training.json", train, training.markdown(train))
    decode = decoding.run(presets, repeats=args.repeats)
    save(out / "decoding.json", decode, decoding.markdown(decode))
    (out / "summary.md").write_text("## Training\n\n" + training.markdown(train)
                                    + "\n\n## Decoding\n\n" + decoding.markdown(decode) + "\n")


if __name__ == "__main__":
    main()
