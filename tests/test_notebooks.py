"""Every notebook in notebooks/ runs top to bottom (nbclient, a fresh kernel, the
quick sizes of MEMFUSE_NB_QUICK=1) without a cell error, and is committed without
outputs.  ~2.5 minutes on 2 busy cores, most of it Thunder compiling nanoGPT."""
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))

nbformat = pytest.importorskip("nbformat", reason="the [test] extra installs nbformat")


def test_there_are_notebooks():
    names = {os.path.basename(p) for p in NOTEBOOKS}
    assert {"01_seed.ipynb", "02_transformer_training.ipynb", "03_scheduler.ipynb", "04_gpu.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, monkeypatch):
    pytest.importorskip("nbclient", reason="the [test] extra installs nbclient")
    pytest.importorskip("ipykernel", reason="the [test] extra installs ipykernel")
    from nbclient import NotebookClient

    monkeypatch.setenv("MEMFUSE_NB_QUICK", "1")  # the kernel inherits the environment
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if os.path.basename(path) != "04_gpu.ipynb" or _has_cuda():
        assert images > 0, f"{path}: no plot was shown"


def _has_cuda():
    import torch

    return torch.cuda.is_available()
