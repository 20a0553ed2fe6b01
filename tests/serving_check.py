"""Run in a fresh process by test_export.py: what a model server does with an export, using
only `tensorflow` and `tensorflow_text` (never this project).

    python serving_check.py VERSION_DIR JSON_INPUTS  ->  JSON on stdout
"""

import json
import sys

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops, as TF Serving links them)
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry
from tensorflow_serving.apis import prediction_log_pb2


def unregistered_ops(version_dir):
    proto = saved_model_pb2.SavedModel()
    with open(f"{version_dir}/saved_model.pb", "rb") as f:
        proto.ParseFromString(f.read())
    ops = set()
    for graph in proto.meta_graphs:
        ops |= {node.op for node in graph.graph_def.node}
        for function in graph.graph_def.library.function:
            ops |= {node.op for node in function.node_def}
    functions = {f.signature.name for g in proto.meta_graphs for f in g.graph_def.library.function}
    return sorted(op for op in ops if op_def_registry.get(op) is None and op not in functions), len(ops)


def run_warmup(loaded, version_dir):
    results = []
    for record in tf.data.TFRecordDataset(f"{version_dir}/assets.extra/tf_serving_warmup_requests"):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        request = log.predict_log.request
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        outputs = loaded.signatures[request.model_spec.signature_name](
            **{k: tf.constant(v) for k, v in inputs.items()})
        merged = merged_like_the_batcher(loaded, request.model_spec.signature_name, inputs)
        results.append([request.model_spec.signature_name, sorted(outputs), merged])
    return results


def merged_like_the_batcher(loaded, signature, inputs):
    """TF Serving's batching concatenates requests along the first dimension of every input:
    two copies of a request, merged so, must give twice its rows (a scalar cannot merge)."""
    try:
        merged = {k: tf.constant(np.concatenate([v, v])) for k, v in inputs.items()}
    except ValueError as error:
        return f"cannot merge: {error}"
    outputs = loaded.signatures[signature](**merged)
    return {k: int(v.shape[0]) for k, v in outputs.items()}


def main():
    version_dir, inputs = sys.argv[1], json.loads(sys.argv[2])
    loaded = tf.saved_model.load(version_dir)
    outputs = loaded.signatures["serving_default"](inputs=tf.constant(inputs, tf.string))
    unregistered, op_count = unregistered_ops(version_dir)
    print(json.dumps({
        "translations": [t.decode("utf-8") for t in outputs["translations"].numpy()],
        "scores": outputs["scores"].numpy().tolist(),
        "unregistered_ops": unregistered,
        "op_count": op_count,
        "warmup": run_warmup(loaded, version_dir),
        "project_imported": any(m.startswith(("keras_transformer", "trainers", "export"))
                                for m in sys.modules),
    }))


if __name__ == "__main__":
    main()
