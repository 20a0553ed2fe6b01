"""The label-smoothed cross-entropy with its gradient written out (speed work; see
kernels/__init__.py)."""

import tensorflow as tf


def smoothed_cross_entropy(labels, logits, label_smoothing):
    """Per-token cross-entropy of `logits` [..., V] against the smoothed target
    (1 - eps) * one_hot(labels) + eps / V (§5.4), computed in float32, with its gradient
    softmax - target.

    loss = logsumexp(z) - (1 - eps) z_y - eps mean(z). One softmax serves the loss and the
    gradient; logsumexp(z) = max(z) - log(max(softmax)), read off the most probable token,
    whose probability (at least 1 / V) never underflows. The gradient is written by hand, so
    neither the smoothed target nor log-probabilities [..., V] are materialised. (TensorFlow's
    fused sparse cross-entropy kernel ran 6x slower than this softmax on the CPU.)
    """
    eps = float(label_smoothing)
    shape = tf.shape(labels)
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])

    @tf.custom_gradient
    def loss_fn(logits):
        probs = tf.nn.softmax(logits)
        log_norm = tf.reduce_max(logits, -1) - tf.math.log(tf.reduce_max(probs, -1))
        target = tf.gather(logits, labels, batch_dims=1)
        loss = log_norm - (1.0 - eps) * target - eps * tf.reduce_mean(logits, -1)

        def grad(d):
            vocab = tf.cast(tf.shape(logits)[-1], tf.float32)
            g = d[:, None] * probs - (d * (eps / vocab))[:, None]
            rows = tf.range(tf.shape(labels)[0])
            return tf.tensor_scatter_nd_add(g, tf.stack([rows, labels], 1), (eps - 1.0) * d)

        return loss, grad

    flat = loss_fn(tf.reshape(tf.cast(logits, tf.float32), [-1, tf.shape(logits)[-1]]))
    return tf.reshape(flat, shape)
