"""Speed work: four hand-written kernels that replace stock Keras/TensorFlow pieces and compute
the same thing (tests check each against NumPy or the stock computation). Nothing here is in the paper;
each stays because the end-to-end benchmark shows it pays:

    python -m benchmarks.kernels --minutes 1.5 --repeats 2

trains `python -m trainers.wmt` on the sample corpus (the quick start's model and batches) with
all four, with each one replaced by its stock version, and with all four replaced; real target
tokens/s, median of the runs (2-core AMD EPYC, AVX2 + FMA, TensorFlow 2.21, float32):

KERNEL_TABLE

- `fused_adam.FusedAdam`: each variable updated by TensorFlow's fused `ResourceApplyAdam`
  (stock: `keras.optimizers.Adam`, about twenty ops per variable).
- `layer_norm.layer_norm`: the closed-form gradient of layer normalization (stock: autodiff
  of the same formula).
- `dropout.Dropout`: 16 random bits per element instead of a float (stock:
  `keras.layers.Dropout`).
- `cross_entropy.smoothed_cross_entropy`: the label-smoothed loss from one softmax, its
  gradient written out (stock: `tf.nn.softmax_cross_entropy_with_logits` on the smoothed
  one-hot target).
"""
