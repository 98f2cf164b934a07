"""Every notebook under notebooks/ executes top to bottom at its tiny size (VACO_JAX_TINY=1).

Each notebook ends with its own assertions, so a notebook that runs but computes nonsense fails
here too. Kernels run this interpreter (jupyter_client maps the `python3` kernel to
`sys.executable`), import this checkout (PYTHONPATH), share JAX's persistent compilation cache with
the tests, and get `TIMEOUT_S` for the whole notebook.
"""

import os
import pathlib
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 300
CACHE_DIR = os.environ.get("VACO_JAX_TEST_CACHE", str(ROOT / ".jax_cache"))


def test_the_notebooks_are_found():
    assert {"quickstart.ipynb", "analysis.ipynb", "custom_env.ipynb", "leaderboard.ipynb"} <= {
        p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("VACO_JAX_TINY", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", CACHE_DIR)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

    notebook = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + TIMEOUT_S
    client = nbclient.NotebookClient(
        notebook, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}},
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())))
    client.execute()   # raises CellExecutionError (with the traceback) if any cell fails

    assert time.monotonic() < deadline, f"{path.name} took more than {TIMEOUT_S} s"
    plots = any("plt." in c.source or "plotting." in c.source for c in notebook.cells)
    images = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images or not plots, f"{path.name} plots but produced no figure"
