"""One metrics writer: JSONL (machines), TensorBoard events (curves) and progress lines (people)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping

import numpy as np


def _scalar(v):
  v = np.asarray(v)
  return float(v) if v.size == 1 else None


class MetricsWriter:
  """Writes scalars to <workdir>/<name>_metrics.jsonl and TensorBoard event files.

  `keep`: for a resumed run, which of the file's existing rows stay (the
  rows a killed run wrote after its last checkpoint are written again by
  the resumed one, and must not appear twice); None keeps every row.
  """

  def __init__(self, workdir: str, *, name: str = 'train',
               tensorboard: bool = True,
               keep: Callable[[dict], bool] | None = None):
    os.makedirs(workdir, exist_ok=True)
    self.name = name
    path = os.path.join(workdir, f'{name}_metrics.jsonl')
    if keep is not None and os.path.exists(path):
      with open(path) as f:
        rows = [line for line in f if line.strip()]
      # A row cut by a kill mid-write is dropped with the rest after it.
      kept = []
      for line in rows:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:
          break
        if keep(row):
          kept.append(json.dumps(row) + '\n')
      with open(path + '.tmp', 'w') as f:
        f.writelines(kept)
      os.replace(path + '.tmp', path)
    self._jsonl = open(path, 'a')
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, 'tb', name))

  def write(self, step: int, metrics: Mapping[str, object]) -> None:
    row = {'step': int(step), 'time': time.time()}
    for k, v in metrics.items():
      s = _scalar(v) if not isinstance(v, (str, dict, list)) else None
      if s is not None and math.isfinite(s):
        row[k] = s
        if self._tb is not None:
          self._tb.add_scalar(k, s, step)
    self._jsonl.write(json.dumps(row) + '\n')
    self._jsonl.flush()

  def close(self) -> None:
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()


class NullWriter:
  """A MetricsWriter that writes nothing (processes other than the first)."""

  def write(self, step: int, metrics: Mapping[str, object]) -> None:
    del step, metrics

  def close(self) -> None:
    pass


class Progress:
  """Progress lines: step / total, rate, ETA and a few chosen metrics."""

  def __init__(self, total: int, *, label: str, start: int = 0,
               stream=sys.stdout):
    self.total, self.label, self.start = total, label, start
    self.t0 = time.perf_counter()
    self.stream = stream

  def update(self, step: int, metrics: Mapping[str, float]) -> None:
    done = step - self.start
    dt = time.perf_counter() - self.t0
    rate = done / dt if dt > 0 else 0.0
    eta = (self.total - step) / rate if rate > 0 else float('nan')
    width = 20
    filled = int(width * step / max(self.total, 1))
    bar = '#' * filled + '.' * (width - filled)
    parts = ' '.join(f'{k} {v:.4g}' for k, v in metrics.items())
    eta_s = f'{eta:4.0f}s' if math.isfinite(eta) else '   ?s'
    self.stream.write(f'[{self.label}] [{bar}] {step}/{self.total} '
                      f'{rate:5.2f} it/s eta {eta_s}  {parts}\n')
    self.stream.flush()
