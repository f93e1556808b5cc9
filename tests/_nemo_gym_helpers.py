"""What the NeMo-Gym row tests share: the fixtures' folder, `experiments.verify` as a command, a refused row."""

import json
import os
import re
import subprocess
import sys

import pytest

from cascade_jax.domains import nemo_gym

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, 'tests', 'data', 'nemo_gym')


def verify(rows, out, *extra):
  """`python -m experiments.verify` in its own process (its absl flags are
  its own)."""
  return subprocess.run(
      [sys.executable, '-m', 'experiments.verify', f'--rows={rows}',
       f'--out={out}', '--test_seconds=1', '--workers=2', *extra],
      cwd=ROOT, capture_output=True, text=True, timeout=600)


def assert_refused(tmp_path, row, says):
  """A file of the one row is refused, naming its file, line 1 and `says`."""
  path = tmp_path / 'rows.jsonl'
  path.write_text(json.dumps(row) + '\n')
  with pytest.raises(nemo_gym.RowError, match=f'{path}:1: {re.escape(says)}'):
    nemo_gym.read_rows(str(path))
