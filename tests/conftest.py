import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Two logical CPU devices, so MirroredStrategy tests run two replicas on one machine. This must
# happen before TensorFlow initialises its devices, hence at import time.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends under float32, whatever it set."""
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="session")
def two_cpu_replicas():
    """One MirroredStrategy over the two logical CPUs for every in-process test: a second
    strategy in the same process numbers its collective ops from the same start, and the
    collective executor then mistakes one's all-reduce for the other's (a shape mismatch)."""
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def small_config(**overrides):
    from keras_transformer import TransformerConfig

    values = dict(num_layers=2, d_model=32, d_ff=64, num_heads=4, vocab_size=50, dropout=0.0,
                  max_length=64)
    values.update(overrides)
    return TransformerConfig.preset("tiny", **values)


def random_ids(rng, batch, length, vocab, min_length=1):
    """Ids in [3, vocab) with per-row lengths, zero-padded at the end."""
    ids = np.zeros((batch, length), np.int32)
    for row in range(batch):
        n = rng.integers(min_length, length + 1)
        ids[row, :n] = rng.integers(3, vocab, n)
    return ids


@pytest.fixture(scope="session")
def sample_tokenizer():
    """The shared BPE vocabulary of the sample corpus's training split."""
    from keras_transformer.data import sample_corpus
    from keras_transformer.tokenizer import Tokenizer

    pairs = sample_corpus.sample_pairs("train")
    return Tokenizer.train((s for pair in pairs for s in pair), 2000)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module, *args, env=None, **kwargs):
    """`python -m module args...` from the repository root, CPU only, output captured."""
    import subprocess
    import sys

    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
                   **(env or {})}
    kwargs.setdefault("text", True)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=environment,
                          capture_output=True, **kwargs)


@pytest.fixture(scope="session")
def main_job(tmp_path_factory):
    """The README's main job, run once for every test that reads what it leaves:
    (model_dir, the finished process)."""
    model_dir = tmp_path_factory.mktemp("main_job") / "run"
    result = run_module("trainers.wmt", "--strategy", "mirrored", "--dataset", "sample",
                        "--model_dir", str(model_dir), timeout=1500)
    return model_dir, result
