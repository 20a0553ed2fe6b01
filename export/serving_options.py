"""The per-request options of the exported `translate_with_options` signature, in the
signature's order, with their dtypes: what the SavedModel takes (export/saved_model.py) and
what the client sends (export/client.py). Imports nothing, so the client stays light."""

OPTION_DTYPES = {"beam_size": "int32", "alpha": "float32", "max_extra": "int32",
                 "num_return": "int32"}
OPTIONS = tuple(OPTION_DTYPES)
