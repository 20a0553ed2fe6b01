"""Exported SavedModels, checked as TF Serving would use them: in a fresh process, by their
signatures, op registry, warm-up file, bad requests, and through the client."""

import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_EXTRA = 8
INPUTS = ["The dog sleeps.", "", "Die alten Männer sehen keine roten Autos.", "Ich lache.",
          "A teacher knows that a child sees a ball.", "Äpfel?"]


def run(*args, **kwargs):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900, **kwargs)


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A small model trained under MirroredStrategy on two logical CPUs, in float32 (the
    exports are compared with in-process float32 translations)."""
    model_dir = tmp_path_factory.mktemp("trained") / "run"
    result = run("-m", "trainers.wmt", "--dataset", "sample", "--strategy", "mirrored",
                 "--logical_cpus", "2", "--num_layers", "1", "--d_model", "32", "--d_ff", "64",
                 "--num_heads", "2", "--vocab_size", "500", "--batch_tokens", "512",
                 "--train_steps", "20", "--validate_every_steps", "10", "--warmup_steps", "10",
                 "--no_eval", "--precision", "float32", "--model_dir", str(model_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 replica(s)" in result.stdout
    return model_dir


@pytest.fixture(scope="module")
def export_dir(trained_dir, tmp_path_factory):
    target = tmp_path_factory.mktemp("models") / "transformer"
    for _ in range(2):  # the second export becomes version 2
        result = run("-m", "export.saved_model", "--model_dir", str(trained_dir),
                     "--export_dir", str(target), "--max_extra", str(MAX_EXTRA))
        assert result.returncode == 0, result.stderr[-3000:]
    return target


@pytest.fixture(scope="module")
def loaded(export_dir):
    return tf.saved_model.load(str(export_dir / "1"))


def test_versions_are_numbered(export_dir):
    assert sorted(p.name for p in export_dir.iterdir()) == ["1", "2"]


@pytest.mark.slow
def test_fresh_process_serves_like_the_translator(trained_dir, export_dir):
    from keras_transformer.translator import Translator
    from keras_transformer.run_dir import load_trained

    result = run("tests/serving_check.py", str(export_dir / "1"), json.dumps(INPUTS))
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout)
    assert not served["project_imported"]
    assert served["unregistered_ops"] == [] and served["op_count"] > 20
    nbest = ["nbest_scores", "nbest_translations", "scores", "translations"]
    assert served["warmup"] == [
        ["serving_default", ["scores", "translations"], {"scores": 4, "translations": 4}],
        ["translate_with_options", nbest, dict.fromkeys(nbest, 4)],
        ["translate_ids", ["scores", "sequences"], {"scores": 2, "sequences": 2}]]

    model, tokenizer, _ = load_trained(trained_dir)
    expected = Translator(model, tokenizer, max_extra=MAX_EXTRA).translate(INPUTS)
    expected[1] = ""  # a blank request gets an empty translation
    assert served["translations"] == expected
    assert served["scores"][1] == 0.0


def test_export_calls_the_searches_a_translator_traced(trained_dir, tmp_path, monkeypatch):
    """The final evaluation hands its Translator to the export: the signatures call the
    searches it traced (beam search is traced once in the process, counted by wrapping it;
    `tf.saved_model.save` would otherwise trace it again) and, loaded in a fresh process, the
    SavedModel translates as that Translator did."""
    import keras_transformer.translator as translator_module
    from export.saved_model import export
    from keras_transformer.run_dir import load_trained

    traces = []
    beam_search = translator_module.beam_search
    monkeypatch.setattr(translator_module, "beam_search",
                        lambda *args, **kwargs: traces.append(1) or beam_search(*args, **kwargs))
    model, tokenizer, _ = load_trained(trained_dir)
    translator = translator_module.Translator(model, tokenizer, max_extra=MAX_EXTRA)
    expected = translator.translate(INPUTS)
    assert len(traces) == 1
    target = export(model, trained_dir / "vocab.model", tmp_path / "models",
                    max_extra=MAX_EXTRA, translator=translator)
    assert len(traces) == 1
    with pytest.raises(ValueError, match="translator"):
        export(load_trained(trained_dir)[0], trained_dir / "vocab.model", tmp_path / "other",
               translator=translator)
    result = run("tests/serving_check.py", str(target), json.dumps(INPUTS))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["translations"] == expected


def test_saved_model_cli_lists_the_signatures(export_dir):
    cli = pathlib.Path(sys.executable).with_name("saved_model_cli")
    result = subprocess.run([str(cli), "show", "--dir", str(export_dir / "1"), "--all"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    for signature in ("serving_default", "translate_with_options", "translate_ids"):
        assert f"signature_def['{signature}']" in text
    for line in ("inputs['inputs'] tensor_info:", "outputs['translations'] tensor_info:",
                 "inputs['beam_size'] tensor_info:", "inputs['source_ids'] tensor_info:"):
        assert line in text
    assert "dtype: DT_STRING" in text and "dtype: DT_INT32" in text and "DT_FLOAT" in text


def test_bad_requests(loaded):
    serve = loaded.signatures["serving_default"]
    empty_batch = serve(inputs=tf.constant([], tf.string))
    assert empty_batch["translations"].shape == (0,)
    long_input = " ".join(["dog"] * 5000)
    out = serve(inputs=tf.constant([long_input, "  ", "Äpfel?"]))
    translations = out["translations"].numpy()
    assert translations[1] == b"" and len(translations) == 3
    assert np.all(np.isfinite(out["scores"].numpy()))
    # Issue 23, item 17: bytes that are not UTF-8 are refused, naming the row, rather than
    # translated into an invented sentence.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"not valid UTF-8 in row\(s\)"
                       r"[^\[]*\[2\]"):
        serve(inputs=tf.constant(["Hi.", "Ho.", b"\xff\xfe\xfa abc"]))
    ids = loaded.signatures["translate_ids"]
    for bad in ([[5, 10**6, 2]], [[5, -1, 2]]):  # items 12 and 18
        with pytest.raises(tf.errors.InvalidArgumentError, match="outside the vocabulary"):
            ids(source_ids=tf.constant(bad, tf.int32))
    options = loaded.signatures["translate_with_options"]
    for beam, alpha, num_return, message in (
            (0, 0.6, 1, "beam_size"), (17, 0.6, 1, "beam_size must be <= 16"),
            (1000, 0.6, 1, "beam_size"), (4, -0.5, 1, "alpha"), (4, float("nan"), 1, "alpha"),
            (4, float("inf"), 1, r"alpha must be a number in \[0, 10\]"), (4, 1e30, 1, "alpha"),
            (4, 0.6, 5, "num_return must be <= beam_size"), (4, 0.6, 0, "num_return"),
            ([4, 4], 0.6, 1, "beam_size must be one value, or one value per input")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            options(inputs=tf.constant(["Hi.", "Ho.", "Ha."]), beam_size=tf.constant(beam),
                    alpha=tf.constant(alpha), max_extra=tf.constant(5),
                    num_return=tf.constant(num_return))


def test_ids_signature_cuts_like_the_strings_and_empties_blank_rows(trained_dir):
    """Issue 14: an over-long `source_ids` row is cut to max_input_length pieces ending in
    EOS, exactly as the string signatures cut text; an all-padding row gives an empty
    sequence and score 0, like a blank string. (The exported functions, in process, with a
    short max_input_length so the search stays small.)"""
    from export.saved_model import TranslationModule
    from keras_transformer.run_dir import load_trained

    model, tokenizer, _ = load_trained(trained_dir)
    module = TranslationModule(model, pathlib.Path(trained_dir) / "vocab.model",
                               max_extra=MAX_EXTRA, max_input_length=6)
    text = "A teacher knows that a child sees a ball."
    pieces = tokenizer.tokenize([text]).to_list()[0]
    assert len(pieces) > 6
    by_text = module.serving_default(tf.constant([text]))
    rows = tf.constant([pieces + [2], [0] * (len(pieces) + 1)], tf.int32)
    by_ids = module.translate_ids(rows)
    np.testing.assert_allclose(by_ids["scores"][0], by_text["scores"][0], rtol=1e-5)
    assert tokenizer.detokenize(by_ids["sequences"][:1]).numpy()[0] == \
        by_text["translations"].numpy()[0]
    assert by_ids["scores"][1] == 0.0 and not np.any(by_ids["sequences"][1])
    cut_by_hand = tf.constant([pieces[:5] + [2]], tf.int32)
    np.testing.assert_allclose(module.translate_ids(cut_by_hand)["scores"][0],
                               by_text["scores"][0], rtol=1e-5)


def test_options_signature_and_ids_signature_agree(loaded, trained_dir):
    from keras_transformer.run_dir import load_tokenizer

    texts = tf.constant(INPUTS[:4])
    default = loaded.signatures["serving_default"](inputs=texts)
    same = loaded.signatures["translate_with_options"](
        inputs=texts, beam_size=tf.constant(4), alpha=tf.constant(0.6),
        max_extra=tf.constant(MAX_EXTRA), num_return=tf.constant(1))
    np.testing.assert_array_equal(default["translations"], same["translations"])
    np.testing.assert_allclose(default["scores"], same["scores"], rtol=1e-5)
    greedy = loaded.signatures["translate_with_options"](
        inputs=texts, beam_size=tf.constant(1), alpha=tf.constant(0.0), max_extra=tf.constant(3),
        num_return=tf.constant(1))
    assert greedy["translations"].shape == (4,)
    pieces = load_tokenizer(trained_dir).tokenize(["Ich lache."]).to_list()[0]
    ids = loaded.signatures["translate_ids"](source_ids=tf.constant([pieces + [2]], tf.int32))
    assert ids["sequences"].shape[0] == 1
    np.testing.assert_allclose(ids["scores"], default["scores"][3:4], rtol=1e-5)


def test_options_per_row_merge_like_separate_requests(trained_dir):
    """Issue 14, items 10 and 11: TF Serving's batcher concatenates requests row-wise, so the
    options come one value per row; a merged batch must answer each request as it would
    alone (checked against `serving_default`, the module's other search path, and greedy
    search), and the n-best lists hold num_return hypotheses, best first, padded with empty
    strings up to the batch's largest num_return. (In process, with short inputs.)"""
    from export.saved_model import TranslationModule
    from keras_transformer.decoding import greedy_search
    from keras_transformer.run_dir import load_trained

    model, tokenizer, _ = load_trained(trained_dir)
    module = TranslationModule(model, pathlib.Path(trained_dir) / "vocab.model",
                               max_extra=MAX_EXTRA, max_input_length=8)
    first, second = INPUTS[:3], INPUTS[3:5]
    alone = module.translate_with_options(tf.constant(first), 4, 0.6, MAX_EXTRA, 3)
    merged = module.translate_with_options(
        tf.constant(first + second), [4, 4, 4, 1, 1], [0.6, 0.6, 0.6, 0.0, 0.0],
        [MAX_EXTRA] * 3 + [3, 3], [3, 3, 3, 1, 1])
    by_default = module.serving_default(tf.constant(first))
    np.testing.assert_array_equal(merged["translations"][:3], by_default["translations"])
    np.testing.assert_allclose(merged["scores"][:3], by_default["scores"], rtol=1e-5)
    np.testing.assert_array_equal(merged["nbest_translations"][:3], alone["nbest_translations"])
    np.testing.assert_allclose(merged["nbest_scores"][:3], alone["nbest_scores"], rtol=1e-5)
    assert merged["nbest_translations"].shape == (5, 3)
    scores = merged["nbest_scores"].numpy()
    assert np.all(np.diff(scores[[0, 2]], axis=1) <= 1e-6)  # best first (row 1 is blank)
    assert len(set(merged["nbest_translations"].numpy()[0])) == 3
    assert list(merged["nbest_translations"].numpy()[3, 1:]) == [b"", b""]
    assert np.all(scores[3:, 1:] == 0.0) and np.all(scores[1] == 0.0)

    source = module.encode(tf.constant(second))
    greedy = greedy_search(model, source, bos_id=1, eos_id=2, max_extra=3)
    np.testing.assert_array_equal(merged["translations"][3:],
                                  tokenizer.detokenize(greedy["sequences"]))


def test_batching_parameters_parse_as_tf_serving_reads_them():
    """export/batching_parameters.txt against the BatchingParameters message of TF Serving's
    session_bundle_config.proto (rebuilt here: the pip packages do not ship it), and the
    rules the server checks: allowed sizes increasing, the last one max_batch_size."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
    from google.protobuf import wrappers_pb2  # noqa: F401  (registers the wrapper types)

    proto = descriptor_pb2.FileDescriptorProto(
        name="batching_check.proto", package="check", syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"])
    message = proto.message_type.add(name="BatchingParameters")
    field = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate([
            ("max_batch_size", ".google.protobuf.Int64Value"),
            ("batch_timeout_micros", ".google.protobuf.Int64Value"),
            ("max_enqueued_batches", ".google.protobuf.Int64Value"),
            ("num_batch_threads", ".google.protobuf.Int64Value"),
            ("thread_pool_name", ".google.protobuf.StringValue"),
            ("allowed_batch_sizes", None), ("pad_variable_length_inputs", None)], start=1):
        if kind:
            message.field.add(name=name, number=number, type=field.TYPE_MESSAGE,
                              type_name=kind, label=field.LABEL_OPTIONAL)
        elif name == "allowed_batch_sizes":
            message.field.add(name=name, number=number, type=field.TYPE_INT64,
                              label=field.LABEL_REPEATED)
        else:
            message.field.add(name=name, number=number, type=field.TYPE_BOOL,
                              label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.Default()
    pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("check.BatchingParameters"))
    text = (ROOT / "export" / "batching_parameters.txt").read_text()
    params = text_format.Parse(text, cls())
    sizes = list(params.allowed_batch_sizes)
    assert sizes == sorted(set(sizes)) and sizes[-1] == params.max_batch_size.value
    assert params.num_batch_threads.value >= 1 and not params.pad_variable_length_inputs


def decoded(value):
    if isinstance(value, bytes):
        return value.decode()
    return [decoded(v) for v in value] if isinstance(value, list) else value


class FakeServing:
    """TF Serving's REST and gRPC predict APIs on 127.0.0.1, answered by the SavedModel, to
    check the client's requests and its reading of the responses."""

    def __init__(self, loaded):
        self.loaded = loaded

    def predict(self, signature, inputs):
        fn = self.loaded.signatures[signature]
        tensors = {k: tf.constant(v, dtype=fn.structured_input_signature[1][k].dtype)
                   for k, v in inputs.items()}
        return fn(**tensors)

    def start_rest(self):
        import http.server

        serving = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                assert self.path == "/v1/models/transformer:predict", self.path
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outputs = serving.predict(body["signature_name"], body["inputs"])
                reply = {"outputs": {key: decoded(value.numpy().tolist())
                                     for key, value in outputs.items()}}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def start_grpc(self):
        from concurrent import futures

        import grpc
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        serving = self

        class Servicer(prediction_service_pb2_grpc.PredictionServiceServicer):
            def Predict(self, request, context):
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                outputs = serving.predict(request.model_spec.signature_name, inputs)
                response = predict_pb2.PredictResponse()
                for key, value in outputs.items():
                    response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
                return response

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Servicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        return server, port


def test_client_rest_and_grpc(loaded):
    from export import client

    serving = FakeServing(loaded)
    direct = loaded.signatures["serving_default"](inputs=tf.constant(INPUTS[:3]))
    expected = [t.decode() for t in direct["translations"].numpy()]
    rest = serving.start_rest()
    grpc_server, port = serving.start_grpc()
    try:
        over_rest = client.predict_rest(f"127.0.0.1:{rest.server_port}", "transformer",
                                        INPUTS[:3])
        over_grpc = client.predict_grpc(f"127.0.0.1:{port}", "transformer", INPUTS[:3])
        with_options = client.predict_rest(f"127.0.0.1:{rest.server_port}", "transformer",
                                           INPUTS[:3], {"beam_size": 4, "alpha": 0.6,
                                                        "max_extra": MAX_EXTRA})
        nbest = {protocol: predict(address, "transformer", INPUTS[:3],
                                   {"max_extra": MAX_EXTRA, "num_return": 3})
                 for protocol, predict, address in (
                     ("rest", client.predict_rest, f"127.0.0.1:{rest.server_port}"),
                     ("grpc", client.predict_grpc, f"127.0.0.1:{port}"))}
    finally:
        rest.shutdown()
        grpc_server.stop(0)
    assert [t for t, _ in over_rest] == expected
    assert [t for t, _ in over_grpc] == expected
    assert [t for t, _ in with_options] == expected
    for rest_hypotheses, grpc_hypotheses in zip(nbest["rest"], nbest["grpc"]):
        assert [t for t, _ in rest_hypotheses] == [t for t, _ in grpc_hypotheses]
        np.testing.assert_allclose([s for _, s in rest_hypotheses],
                                   [s for _, s in grpc_hypotheses], rtol=1e-5)
    assert [hypotheses[0][0] for hypotheses in nbest["grpc"]] == expected
    assert all(len(hypotheses) == 3 for hypotheses in nbest["grpc"])
    with pytest.raises(client.ServingError):
        client.predict_rest("127.0.0.1:9", "transformer", ["x"], timeout=5)


def test_beam_of_one_is_greedy_search_in_the_saved_model(trained_dir):
    """Issue 23, item 11: beam_size 1 means greedy search in the SavedModel too (it was beam
    search with the length penalty, which with alpha > 0 can differ), as in `Translator` and
    CTranslate2 (whose greedy output the CTranslate2 tests compare with ours). (The exported
    functions, in process.)"""
    from export.saved_model import TranslationModule
    from keras_transformer.run_dir import load_trained
    from keras_transformer.translator import Translator

    model, tokenizer, _ = load_trained(trained_dir)
    vocab = pathlib.Path(trained_dir) / "vocab.model"
    texts = [t for t in INPUTS if t.strip()]
    greedy = Translator(model, tokenizer, beam_size=1, max_extra=MAX_EXTRA).translate(texts)
    module = TranslationModule(model, vocab, max_extra=MAX_EXTRA)
    by_options = module.translate_with_options(tf.constant(texts), 1, 1.0, MAX_EXTRA, 1)
    assert [t.decode() for t in by_options["translations"].numpy()] == greedy
    greedy_module = TranslationModule(model, vocab, beam_size=1, alpha=1.0, max_extra=MAX_EXTRA)
    by_default = greedy_module.serving_default(tf.constant(texts))
    assert [t.decode() for t in by_default["translations"].numpy()] == greedy


def test_export_refuses_a_max_extra_that_leaves_no_room(trained_dir):
    """Issue 23, item 12: --max_extra >= config.max_length left no piece of the input."""
    from export.saved_model import TranslationModule
    from keras_transformer.config import ConfigError
    from keras_transformer.run_dir import load_trained

    model, _, _ = load_trained(trained_dir)
    with pytest.raises(ConfigError, match="leaves no room for the source"):
        TranslationModule(model, pathlib.Path(trained_dir) / "vocab.model",
                          max_extra=model.config.max_length)
    result = run("-m", "export.saved_model", "--model_dir", str(trained_dir), "--export_dir",
                 str(pathlib.Path(trained_dir).parent / "refused"), "--max_extra",
                 str(model.config.max_length))
    assert result.returncode == 2 and "leaves no room" in result.stderr, result.stderr[-2000:]
