"""Command-line jobs: training on WMT 2014 (or the sample corpus, or files), checkpoint
averaging and translation."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the CLIs print; TF's C++ logs are noise
# TensorFlow's default CPU allocator maps and zeroes large buffers afresh at every step (page
# faults topped a profile of the trainer); the BFC allocator reuses them. Read when TensorFlow
# loads, so it is set here, before any job imports it. `TF_CPU_ALLOCATOR_USE_BFC=false` opts out.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
