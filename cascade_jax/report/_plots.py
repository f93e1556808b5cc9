"""PNG plots of training curves and stage x domain matrices (matplotlib, no display needed)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  # noqa: E402

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def read_metrics(path: str, key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of one key from a metrics JSONL file, in step order.

  A resumed RL stage rewrites the rows after its checkpoint; for files of
  other runs that appended them again, the last row of each step wins.
  """
  by_step = {}
  with open(path) as f:
    for line in f:
      row = json.loads(line)
      if key in row:
        by_step[int(row['step'])] = float(row[key])
  steps = sorted(by_step)
  return steps, [by_step[s] for s in steps]


def plot_curves(series: Series, path: str, *, title: str = '',
                xlabel: str = 'step', ylabel: str = '',
                hlines: Mapping[str, float] | None = None) -> str:
  """One line per series (label -> (x, y)); dashed reference lines by label."""
  fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
  for label, (x, y) in series.items():
    ax.plot(x, y, marker='o', markersize=3, linewidth=1.5, label=label)
  for label, y in (hlines or {}).items():
    ax.axhline(y, linestyle='--', linewidth=1, color='gray')
    ax.annotate(label, (0.01, y), xycoords=('axes fraction', 'data'),
                fontsize=8, color='gray', va='bottom')
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  ax.grid(alpha=0.3)
  if series:
    ax.legend(fontsize=8)
  return _save(fig, path)


def plot_matrix(values: np.ndarray, rows: Sequence[str], cols: Sequence[str],
                path: str, *, title: str = '', fmt: str = '{:.2f}',
                spread: np.ndarray | None = None, diverging: bool = False
                ) -> str:
  """A heatmap with the numbers written in (and +- spread when given)."""
  values = np.asarray(values, np.float64)
  fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 2.5,
                                  0.45 * len(rows) + 1.6), dpi=120)
  if diverging:
    finite = np.abs(values[np.isfinite(values)])
    lim = max(float(finite.max()) if finite.size else 0.0, 1e-6)
    im = ax.imshow(values, cmap='RdBu', vmin=-lim, vmax=lim, aspect='auto')
  else:
    im = ax.imshow(values, cmap='viridis', aspect='auto')
  fig.colorbar(im, ax=ax, fraction=0.04)
  ax.set_xticks(range(len(cols)), cols, rotation=30, ha='right', fontsize=8)
  ax.set_yticks(range(len(rows)), rows, fontsize=8)
  for i in range(len(rows)):
    for j in range(len(cols)):
      if np.isnan(values[i, j]):
        continue
      text = fmt.format(values[i, j])
      if spread is not None:
        text += '\n±' + fmt.format(spread[i, j])
      ax.text(j, i, text, ha='center', va='center', fontsize=7,
              color='black' if diverging else 'white')
  ax.set_title(title, fontsize=10)
  return _save(fig, path)


def _save(fig, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
