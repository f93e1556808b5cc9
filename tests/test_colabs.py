"""The Colab notebooks: each .py (jupytext percent) is paired with its .ipynb and runs top to bottom."""

import glob
import os

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

_COLABS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'colabs')
NOTEBOOKS = sorted(glob.glob(os.path.join(_COLABS, '*.py')))


def test_there_are_notebooks():
  assert len(NOTEBOOKS) >= 2


# CI runs the notebooks (the default suite's 15 minutes: the walkthrough's
# cascade is the quick cascade tests/test_cascade.py runs by default, the
# public-data notebook's readers are tests/test_data.py's).
_SLOW = ('moe_explore.py', 'recipe_walkthrough.py', 'public_data.py')


@pytest.mark.parametrize('path', [
    pytest.param(p, marks=pytest.mark.slow) if os.path.basename(p) in _SLOW
    else p for p in NOTEBOOKS], ids=os.path.basename)
def test_notebook_is_paired_and_runs(path):
  py = jupytext.read(path)
  ipynb_path = path[:-3] + '.ipynb'
  assert os.path.exists(ipynb_path), f'run: jupytext --sync {path}'
  nb = nbformat.read(ipynb_path, as_version=4)
  code = lambda n: [c.source for c in n.cells if c.cell_type == 'code']
  assert code(nb) == code(py), f'{ipynb_path} is stale: jupytext --sync {path}'
  client = NotebookClient(nb, timeout=600, kernel_name='python3',
                          resources={'metadata': {'path': _COLABS}})
  client.execute()   # raises CellExecutionError naming the failing cell
