"""Command-line jobs: training on WMT 2014 (or the sample corpus, or files), checkpoint
averaging and translation."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the CLIs print; TF's C++ logs are noise
