"""A client for a TF Serving model server running an exported translation model, over REST
(port 8501) or gRPC (port 8500). Sentences come from the arguments or standard input.

    python -m export.client --server localhost:8501 --model transformer "The dog sleeps."
    echo "The dog sleeps." | python -m export.client --server localhost:8500 --protocol grpc
    python -m export.client --server localhost:8501 --beam_size 8 --alpha 1.0 "..."
    python -m export.client --server localhost:8501 --beam_size 4 --num_return 3 "..."

With options the client asks `translate_with_options`, sending each option once per sentence
(what a batching server can merge).
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

from export.serving_options import OPTION_DTYPES, OPTIONS

DEFAULTS = {"beam_size": 4, "alpha": 0.6, "max_extra": 50, "num_return": 1}


class ServingError(RuntimeError):
    """The server answered with an error, or did not answer."""


def _inputs(texts, options):
    inputs = {"inputs": list(texts)}
    if options:  # the options signature takes them all, one value per sentence
        rows = len(inputs["inputs"])
        inputs.update({k: [v] * rows for k, v in {**DEFAULTS, **options}.items()})
    return inputs, "translate_with_options" if options else "serving_default"


def _results(outputs, options):
    """[(translation, score)], or with num_return > 1 a list of such n-best lists."""
    if options and options.get("num_return", 1) > 1:
        return [list(zip(t, s)) for t, s in zip(outputs["nbest_translations"],
                                                 outputs["nbest_scores"])]
    return list(zip(outputs["translations"], outputs["scores"]))


def predict_rest(server, model, texts, options=None, version=None, timeout=60.0):
    """[(translation, score)] from TF Serving's REST predict API (columnar format); with
    options["num_return"] > 1, the n-best list of each sentence."""
    inputs, signature = _inputs(texts, options)
    path = f"/v1/models/{model}" + (f"/versions/{version}" if version else "") + ":predict"
    url = (server if "://" in server else f"http://{server}") + path
    body = json.dumps({"signature_name": signature, "inputs": inputs}).encode("utf-8")
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            outputs = json.loads(response.read())["outputs"]
    except urllib.error.HTTPError as error:
        raise ServingError(f"{url}: HTTP {error.code}: {error.read().decode(errors='replace')}")
    except (urllib.error.URLError, OSError) as error:
        raise ServingError(f"{url}: {error}") from error
    return _results(outputs, options)


def predict_grpc(server, model, texts, options=None, version=None, timeout=60.0):
    """Like `predict_rest`, through TF Serving's gRPC PredictionService."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    inputs, signature = _inputs(texts, options)
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    if version:
        request.model_spec.version.value = version
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtype=OPTION_DTYPES.get(key)))
    with grpc.insecure_channel(server) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            response = stub.Predict(request, timeout=timeout)
        except grpc.RpcError as error:
            raise ServingError(f"{server}: {error.code().name}: {error.details()}") from error
    outputs = {key: tf.make_ndarray(value).tolist() for key, value in response.outputs.items()}
    outputs = {key: _decoded(value) for key, value in outputs.items()}
    return _results(outputs, options)


def _decoded(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return [_decoded(v) for v in value] if isinstance(value, list) else value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m export.client",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="localhost:8501", help="host:port of TF Serving")
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--version", type=int, default=None)
    parser.add_argument("--protocol", choices=("rest", "grpc"), default="rest")
    parser.add_argument("--beam_size", type=int, default=None)
    parser.add_argument("--alpha", type=float, default=None)
    parser.add_argument("--max_extra", type=int, default=None)
    parser.add_argument("--num_return", type=int, default=None,
                        help="print the n best translations of each sentence")
    parser.add_argument("--scores", action="store_true", help="print the score before each line")
    parser.add_argument("sentences", nargs="*", help="default: one per line on stdin")
    args = parser.parse_args(argv)
    options = {k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None}
    texts = args.sentences or [line.rstrip("\n") for line in sys.stdin]
    predict = predict_rest if args.protocol == "rest" else predict_grpc
    try:
        results = predict(args.server, args.model, texts, options, args.version)
    except ServingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for result in results:
        for translation, score in result if isinstance(result, list) else [result]:
            print(f"{score:.4f}\t{translation}" if args.scores else translation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
