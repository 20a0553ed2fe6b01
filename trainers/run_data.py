"""A run's data: the sentence pairs of each split (--dataset), the vocabulary trained on them,
and the batches training and validation read."""

import pathlib

import tensorflow as tf

from keras_transformer.data import corpora, pipeline
from keras_transformer.tokenizer import Tokenizer, load_or_train_tokenizer

SKIP_COUNTS = {}  # --dataset files: lines skipped per split, counted as the data is read
TRAINING_REGIONS = 16  # stretches of the training files read at once (corpora.files_dataset)


def split_pairs(settings, split):
    """(source, target) string pairs of a split, as a tf.data.Dataset."""
    if settings.dataset == "sample":
        return corpora.sample_dataset(split)
    if settings.dataset == "files":
        paths = getattr(settings, f"{split}_files")
        if not paths:
            raise corpora.DataError(f"--dataset files: no --{split}_files given.")
        counts = SKIP_COUNTS.setdefault(split, corpora.SkipCounts())
        # Training reads the files in stretches at once, so that a corpus of several sources
        # in a row gives batches that mix them; evaluation keeps the files' order.
        regions = TRAINING_REGIONS if split == "train" else 1
        return corpora.files_dataset(paths, counts, regions)
    return corpora.tfds_dataset(settings.tfds_name, split, settings.source_language,
                                settings.target_language, settings.data_dir)


def get_tokenizer(settings, config, model_dir):
    """The run's vocabulary: model_dir/vocab.model when resuming, else the cached one for this
    corpus and size, trained from the training split the first time."""
    own = pathlib.Path(model_dir) / "vocab.model"
    if own.exists():
        return Tokenizer.load(own)
    if settings.dataset == "files":
        key = "files:" + ",".join(str(pathlib.Path(p).resolve()) for p in settings.train_files)
    elif settings.dataset == "wmt14":
        key = f"{settings.tfds_name}:{settings.source_language}"
    else:
        key = "sample"

    def sentences():
        for source, target in split_pairs(settings, "train").as_numpy_iterator():
            yield source.decode("utf-8")
            yield target.decode("utf-8")

    return load_or_train_tokenizer(sentences, config.vocab_size, settings.cache_dir, key)


def deterministic_options():
    """tf.data options for a stream that a backup can restore and a rerun repeats."""
    options = tf.data.Options()
    options.deterministic = True
    # The pipeline's counters (PipelineStats) are not part of the stream a backup restores.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options


def distribution_options():
    """tf.data options for the datasets Keras distributes (training, validation): each
    worker reads its own share, and nothing is autotuned."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    # Keras deletes these datasets' iterators when `fit` ends, and with autotuning on the
    # deletion waits for tf.data's tuning thread, which can sleep for up to a minute while
    # the run stands still (tf.distribute's per-device iterators are autotuned whatever
    # these say: see `distributed`). The training dataset only relays the batches of the
    # resumable iterator, whose own pipeline stays autotuned; validation is a few batches.
    options.autotune.enabled = False
    return options


def distributed(dataset, strategy):
    """`dataset` (with `distribution_options`) as `model.fit` should receive it under
    `strategy`. One replica on the CPU reads it through its own iterator (one dataset per
    replica, left on the host): else tf.distribute wraps it in a multi-device iterator whose
    per-device iterators are autotuned whatever the dataset's options say, and deleting those
    when `fit` ends can wait on tf.data's tuning thread for many seconds."""
    dataset = dataset.with_options(distribution_options())
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return dataset  # the default strategy has no worker_devices
    devices = strategy.extended.worker_devices
    if len(devices) != 1 or tf.DeviceSpec.from_string(devices[0]).device_type != "CPU":
        return dataset
    return strategy.distribute_datasets_from_function(
        lambda _: dataset, tf.distribute.InputOptions(
            experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
            experimental_fetch_to_device=False))


def training_batches(settings, config, tokenizer, num_replicas, static, stats):
    """The training split, shuffled and batched by --batching, repeated without end."""
    return pipeline.make_dataset(
        split_pairs(settings, "train"), tokenizer, batch_tokens=settings.batch_tokens,
        max_length=settings.max_train_length, seed=settings.seed, static=static,
        num_replicas=num_replicas, repeat=True, stats=stats, pad_id=config.pad_id,
        batching=settings.batching).with_options(deterministic_options())


def validation_batches(settings, config, tokenizer, num_replicas, static):
    """The validation split in length-sorted batches of the training budget (in a fixed
    order; pairs over --max_train_length left out, as in training), for Keras' validation loss
    at every epoch end; None without one."""
    if settings.no_validation or (settings.dataset == "files"
                                  and not settings.validation_files):
        return None
    try:
        pairs = split_pairs(settings, "validation")
    except corpora.DataError as error:
        print(f"No validation loss: {error}", flush=True)
        return None
    dataset = pipeline.make_dataset(
        pairs, tokenizer, batch_tokens=settings.batch_tokens,
        max_length=settings.max_train_length, shuffle=False, static=static,
        num_replicas=num_replicas, pad_id=config.pad_id, keep_remainder=True)
    # Counted once, so that Keras knows where the split ends (else it warns that the input
    # "ran out of data" at every validation).
    count = int(dataset.reduce(0, lambda count, _: count + 1))
    return dataset.apply(tf.data.experimental.assert_cardinality(count))


def log_skipped():
    """Logs the lines --dataset files skipped, per split."""
    for split, counts in SKIP_COUNTS.items():
        counts.log(f"--{split}_files")
