"""SavedModels for TF Serving (strings in, translations out) and a client for it."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
