"""keras-hub: a trained run as a preset that keras-hub's own API loads, generates from,
fine-tunes (LoRA too) and saves; and back to a run folder (issue 24)."""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import ROOT, run_module, small_config

import keras_transformer as kt
from keras_transformer import hub

SENTENCES = 48  # of the sample corpus's test split


def sample_sources():
    from keras_transformer.data import sample_corpus

    return [en for en, _ in sample_corpus.sample_pairs("test")[:SENTENCES]]


@pytest.fixture(scope="module")
def preset(main_job, tmp_path_factory):
    """The README's main job written as a keras-hub preset by `python -m export.keras_hub`."""
    model_dir, _ = main_job
    preset_dir = tmp_path_factory.mktemp("preset") / "sample-tiny"
    result = run_module("export.keras_hub", "--model_dir", str(model_dir), "--preset_dir",
                        str(preset_dir), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return preset_dir


def fresh_process(code):
    """Runs `code` in a new Python process; returns what it printed last, as JSON."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900,
                            env={"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
                                 "PATH": "/usr/bin:/bin", **_python_env()})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _python_env():
    import os

    return {k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "HOME", "VIRTUAL"))}


@pytest.mark.slow
def test_from_preset_generates_our_translations(main_job, preset):
    """A run -> preset -> `keras_hub.models.Seq2SeqLM.from_preset` in a fresh process
    (keras-hub's API only, after `import keras_transformer`) -> `generate()` gives exactly
    `Translator`'s greedy (beam 1) and beam-search translations, computed here from the run
    folder by the library's own path."""
    files = sorted(p.name for p in preset.iterdir())
    assert files == ["assets", "config.json", "metadata.json", "model.weights.h5",
                     "preprocessor.json", "task.json", "tokenizer.json"], files
    sources = sample_sources()
    generated = fresh_process(f"""
        import json, keras_hub, keras_transformer
        lm = keras_hub.models.Seq2SeqLM.from_preset({str(preset)!r})
        sources = {sources!r}
        lm.compile(sampler="greedy")
        greedy = lm.generate(sources)
        lm.compile(sampler=keras_transformer.hub.BeamSearch(beam_size=4, alpha=0.6))
        print(json.dumps({{"greedy": list(greedy), "beam": list(lm.generate(sources)),
                          "task": type(lm).__name__}}))
    """)
    from keras_transformer import run_dir

    model, tokenizer, _ = run_dir.load_trained(main_job[0])
    assert generated["task"] == "TransformerSeq2SeqLM"
    assert generated["greedy"] == kt.Translator(model, tokenizer, beam_size=1).translate(sources)
    beam = kt.Translator(model, tokenizer, beam_size=4, alpha=0.6).translate(sources)
    assert generated["beam"] == beam
    assert sum(t != "" for t in beam) == len(beam)  # real translations, not a trivial match


def tiny_task(tokenizer, **config):
    backbone = hub.TransformerBackbone(small_config(vocab_size=tokenizer.vocab_size, **config))
    preprocessor = hub.TransformerSeq2SeqLMPreprocessor(
        hub.TransformerTokenizer(proto=tokenizer.model_proto), encoder_sequence_length=14,
        decoder_sequence_length=64)  # outputs of up to source + 50 tokens fit
    return hub.TransformerSeq2SeqLM(backbone, preprocessor)


PAIRS = {"encoder_text": ["The dog sleeps.", "A small house.", "The cat eats.", "I see a bird."],
         "decoder_text": ["Der Hund schläft.", "Ein kleines Haus.", "Die Katze frisst.",
                          "Ich sehe einen Vogel."]}


def test_fit_on_strings_then_preset_round_trip(sample_tokenizer, tmp_path):
    """`fit` on strings through the preprocessor lowers the loss; `save_to_preset` then
    `from_preset` gives the same logits; the preprocessor builds what our pipeline builds
    (source + EOS, BOS + target, target + EOS)."""
    import keras_hub

    keras.utils.set_random_seed(0)
    task = tiny_task(sample_tokenizer)
    x, y, weights = task.preprocessor(PAIRS)
    source = sample_tokenizer.tokenize(["The dog sleeps."]).to_list()[0]
    target = sample_tokenizer.tokenize(["Der Hund schläft."]).to_list()[0]
    n, m = len(source), len(target)
    assert list(np.asarray(x["encoder_token_ids"][0])[:n + 1]) == source + [kt.tokenizer.EOS_ID]
    assert list(np.asarray(x["decoder_token_ids"][0])[:m + 1]) == [kt.tokenizer.BOS_ID] + target
    assert list(np.asarray(y[0])[:m + 1]) == target + [kt.tokenizer.EOS_ID]
    task.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = task.fit(x=PAIRS, batch_size=4, epochs=8, verbose=0).history["loss"]
    assert history[-1] < history[0] - 0.5, history
    task.save_to_preset(str(tmp_path / "preset"))
    loaded = keras_hub.models.Seq2SeqLM.from_preset(str(tmp_path / "preset"))
    assert isinstance(loaded, hub.TransformerSeq2SeqLM)
    inputs = {k: keras.ops.cast(v, "int32") for k, v in x.items()}
    np.testing.assert_allclose(loaded(inputs), task(inputs), rtol=1e-6, atol=1e-6)
    # the backbone's weights are the Transformer's own variables, not a copy
    assert {id(w) for w in task.backbone.weights} == {
        id(w) for w in task.backbone.transformer.weights}


def test_lora_trains_only_its_weights_and_merges_back(sample_tokenizer, tmp_path):
    """`backbone.enable_lora(rank)` targets the query and value projections; a fit changes
    the LoRA matrices (and, as keras-hub does, those layers' biases) and nothing else; the
    preset saved afterwards converts to a run folder whose merged weights translate as the
    LoRA model does."""
    from export.keras_hub import preset_to_run
    from keras_transformer import run_dir

    keras.utils.set_random_seed(0)
    task = tiny_task(sample_tokenizer)
    backbone = task.backbone

    def count(weights):
        return sum(int(np.prod(w.shape)) for w in weights)

    before = count(backbone.trainable_weights)
    backbone.enable_lora(rank=2)
    lora = [w for w in backbone.trainable_weights if "lora" in w.path]
    # 2 layers x (encoder self, decoder self, decoder cross) x (query, value) = 12 Dense
    # layers, each with A [32, 2] and B [2, 32] (d_model 32, rank 2), and its bias [32]
    assert len(lora) == 12 * 2 and count(lora) == 12 * (32 * 2 + 2 * 32)
    assert count(backbone.trainable_weights) == count(lora) + 12 * 32
    assert count(backbone.trainable_weights) < before / 10
    start = {w.path: w.numpy().copy() for w in backbone.weights}
    task.compile(optimizer=keras.optimizers.Adam(1e-2), sampler="greedy")
    task.fit(x=PAIRS, batch_size=4, epochs=3, verbose=0)
    changed = {w.path for w in backbone.weights if not np.array_equal(start[w.path], w.numpy())}
    trainable = {w.path for w in backbone.trainable_weights}
    assert changed and changed <= trainable and any("lora_kernel_b" in p for p in changed)
    generated = task.generate(PAIRS["encoder_text"])
    task.save_to_preset(str(tmp_path / "preset"))
    preset_to_run(tmp_path / "preset", tmp_path / "run")
    model, tokenizer, _ = run_dir.load_trained(tmp_path / "run")
    merged = kt.Translator(model, tokenizer, beam_size=1).translate(PAIRS["encoder_text"])
    assert merged == list(generated)


@pytest.mark.slow
def test_preset_converts_back_to_a_run_the_tools_read(preset, main_job, tmp_path):
    """preset -> run folder (`python -m export.keras_hub --to_model_dir`): trainers.translate
    translates with it as with the original run, and export.ctranslate2 converts it."""
    run = tmp_path / "run"
    result = run_module("export.keras_hub", "--preset_dir", str(preset), "--to_model_dir",
                        str(run), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    sentences = ["The dog sleeps.", "The small house is red."]
    outputs = [run_module("trainers.translate", "--model_dir", str(folder), *sentences,
                          timeout=600) for folder in (run, main_job[0])]
    assert all(o.returncode == 0 for o in outputs), [o.stderr[-2000:] for o in outputs]
    assert outputs[0].stdout == outputs[1].stdout and outputs[0].stdout.strip()
    converted = run_module("export.ctranslate2", "--model_dir", str(run), "--output_dir",
                           str(tmp_path / "ct2"), timeout=600)
    assert converted.returncode == 0, converted.stderr[-3000:]


def test_other_samplers_are_refused_by_name(sample_tokenizer):
    task = tiny_task(sample_tokenizer)
    task.compile(sampler="top_k")
    with pytest.raises(ValueError, match="TopKSampler"):
        task.generate(["The dog sleeps."])
