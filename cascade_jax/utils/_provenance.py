"""Where a result came from: the code's commit, the command, the machine, the date."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys


def _git(*args: str) -> str:
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  try:
    return subprocess.run(['git', *args], cwd=root, capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ''


def cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def provenance() -> dict:
  """commit (and whether the tree had changes), UTC date, the command line,
  the machine (CPU model, cores), Python and jax versions, jax's backend."""
  import jax  # pylint: disable=g-import-not-at-top
  commit = _git('rev-parse', 'HEAD')
  return dict(
      commit=commit or 'unknown',
      dirty=bool(_git('status', '--porcelain', '--untracked-files=no')),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      command=' '.join(['python'] + sys.argv),
      machine=f'{cpu_model()}, {os.cpu_count()} cores',
      python=platform.python_version(), jax=jax.__version__,
      backend=jax.default_backend())
