"""Speed measurements, side by side with the keras-hub peer."""

import json
import pathlib


def save(path, data, table):
    """Writes `data` as JSON to `path` and `table` (Markdown) beside it, and prints the table."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    path.with_suffix(".md").write_text(table + "\n")
    print(table)
