"""The Colab notebooks, executed cell by cell as CI runs them (small-size switch on); a failing
cell or assertion fails the test."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("notebooks")


def test_there_are_four_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, workdir, monkeypatch):
    monkeypatch.setenv("KT_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("KT_NOTEBOOK_WORKDIR", str(workdir))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(COLAB)}}).execute()
    errors = [o for cell in notebook.cells for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
