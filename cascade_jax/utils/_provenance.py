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


def vector_isa() -> str:
  """The widest x86 vector extension the CPU reports ('avx512', 'avx2',
  'sse'), else the machine's architecture: the CPU kernels' register blocks
  and speed differ by it (docs/results/perf/cpu_kernels_avx2_2026-12-07)."""
  try:
    with open('/proc/cpuinfo') as f:
      flags = next((line.split(':', 1)[1].split() for line in f
                    if line.startswith('flags')), [])
  except OSError:
    flags = []
  for flag, name in (('avx512f', 'avx512'), ('avx2', 'avx2'), ('sse2', 'sse')):
    if flag in flags:
      return name
  return platform.machine()


def provenance() -> dict:
  """commit (and whether the tree had changes), UTC date, the command line,
  the machine (CPU model, cores, vector ISA), Python and jax versions,
  jax's backend."""
  import jax  # pylint: disable=g-import-not-at-top
  commit = _git('rev-parse', 'HEAD')
  return dict(
      commit=commit or 'unknown',
      dirty=bool(_git('status', '--porcelain', '--untracked-files=no')),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      command=' '.join(['python'] + sys.argv),
      machine=f'{cpu_model()}, {os.cpu_count()} cores, {vector_isa()}',
      python=platform.python_version(), jax=jax.__version__,
      backend=jax.default_backend())
