"""One place that turns `--strategy` into a `tf.distribute.Strategy`. TensorFlow is imported
where it is used, so the command line can list the strategies without loading it."""

import json
import logging
import os

logger = logging.getLogger(__name__)

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker", "tpu")


class StrategyError(RuntimeError):
    """The requested strategy cannot run here; the message says why and what to do."""


def split_cpu(count):
    """Splits the CPU into `count` logical devices (before TensorFlow initialises them), so
    MirroredStrategy can run `count` replicas on one machine without accelerators."""
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        raise StrategyError(f"Cannot split the CPU into {count} devices: {error}") from error


def resolve_strategy(name, tpu=None):
    """default: no distribution; one_device: the first GPU, else the CPU; mirrored: every
    local GPU (or logical CPU device); multi_worker: MultiWorkerMirroredStrategy from the
    TF_CONFIG environment variable; tpu: TPUStrategy on `tpu` (an address or name; "local"
    for a TPU VM)."""
    import tensorflow as tf

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        devices = devices or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise StrategyError(
                "--strategy multi_worker reads the cluster from the TF_CONFIG environment "
                "variable, which is not set. On each of N hosts set e.g. TF_CONFIG='{\"cluster\":"
                " {\"worker\": [\"host1:12345\", \"host2:12345\"]}, \"task\": {\"type\": "
                "\"worker\", \"index\": I}}' and run the same command.")
        try:
            json.loads(os.environ["TF_CONFIG"])
        except ValueError as error:
            raise StrategyError(f"TF_CONFIG is not valid JSON: {error}") from error
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        if not tpu:
            raise StrategyError(
                "--strategy tpu: no TPU given and none answers here. On a TPU VM pass "
                "--tpu local; otherwise pass the TPU's name or grpc:// address with --tpu.")
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            return tf.distribute.TPUStrategy(resolver)
        except Exception as error:  # resolvers raise ValueError, NotFoundError, ...
            raise StrategyError(
                f"--strategy tpu: no TPU answered (tpu={tpu!r}): {type(error).__name__}: "
                f"{error}. Run on a TPU VM (--tpu local) or pass the TPU's name or grpc:// "
                "address with --tpu.") from error
    raise StrategyError(f"Unknown strategy {name!r}; choose one of {STRATEGIES}.")


def is_chief(strategy):
    """True on the worker that writes checkpoints, logs and results."""
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type == "chief" or (task_type == "worker" and task_id == 0 and
                                    "chief" not in resolver.cluster_spec().as_dict())


def worker_id(strategy):
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver:
        return f"{resolver.task_type}-{resolver.task_id}"
    return "local"
