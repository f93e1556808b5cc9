"""PNG plots of training curves and stage x domain matrices (matplotlib, no display needed)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.ticker
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


@dataclasses.dataclass
class StagePanel:
  """One RL stage's panel (see `plot_stage_panels`).

  signal: (label, steps, values), what the stage trained on (the sampled
    reward; MOPD: its per-token reverse KL to the teachers).
  evals: own domain -> (pass@1 at the stage's start, at its end).
  mismatch: (steps, max |log pi_learner - log pi_sampler| per step).
  on_eval_scale: whether the signal is a pass rate-like 0-1 quantity that
    can share the evaluation's axis (else it gets its own, on the left).
  """
  name: str
  signal: tuple[str, Sequence[float], Sequence[float]]
  evals: Mapping[str, tuple[float, float]]
  mismatch: tuple[Sequence[float], Sequence[float]] = ((), ())
  on_eval_scale: bool = True


def plot_stage_panels(panels: Sequence[StagePanel], path: str, *,
                      title: str = '', ncols: int = 3) -> str:
  """A small panel per RL stage: its training signal over its steps with
  its own y-range, its own domains' eval pass@1 at its start and end
  (squares, the domain named at the end), and underneath, on a log axis,
  the sampler/learner log-prob mismatch of each step."""
  n = max(len(panels), 1)
  ncols = min(ncols, n)
  nrows = -(-n // ncols)
  fig = plt.figure(figsize=(4.2 * ncols, 3.3 * nrows + 0.6), dpi=110)
  outer = fig.add_gridspec(nrows, ncols, hspace=0.55, wspace=0.42)
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for k, p in enumerate(panels):
    cell = outer[k // ncols, k % ncols].subgridspec(2, 1, height_ratios=(3, 1),
                                                    hspace=0.08)
    top = fig.add_subplot(cell[0])
    low = fig.add_subplot(cell[1], sharex=top)
    label, x, y = p.signal
    top.plot(x, y, color='0.25', linewidth=1.4)
    top.set_ylabel(label, fontsize=7)
    top.set_title(p.name, fontsize=9)
    ev = top if p.on_eval_scale else top.twinx()
    last = max(list(x) or [1])
    for j, (dom, (before, after)) in enumerate(sorted(p.evals.items())):
      c = colors[(j + 1) % len(colors)]
      ev.plot([0, last], [before, after], color=c, linestyle='--',
              linewidth=1, marker='s', markersize=5)
      ev.annotate(f'{dom} {after:.2f}', (last, after), xytext=(-3, 4),
                  textcoords='offset points', ha='right', fontsize=7, color=c)
    if not p.on_eval_scale:
      ev.set_ylabel('eval pass@1', fontsize=7)
      ev.set_ylim(0, 1)
      ev.tick_params(labelsize=7)
    top.ticklabel_format(axis='y', useOffset=False)
    top.tick_params(labelsize=7, labelbottom=False)
    top.grid(alpha=0.3)
    mx, my = p.mismatch
    if len(mx):
      low.semilogy(mx, np.maximum(np.asarray(my, np.float64), 1e-9),
                   color='tab:red', linewidth=1)
      low.annotate(f'max {max(my):.1e}', (0.99, 0.9),
                   xycoords='axes fraction', ha='right', va='top', fontsize=6)
    low.set_ylabel('mismatch', fontsize=7)
    low.set_xlabel('step', fontsize=7)
    low.tick_params(which='both', labelsize=6)
    low.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    low.grid(alpha=0.3)
  fig.suptitle((title + '\n' if title else '') +
               'grey: training signal (own axis) · squares: eval pass@1 of '
               "the stage's domains at its start and end · red: sampler/"
               'learner |Δ log p| max per step', fontsize=8)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, bbox_inches='tight')
  plt.close(fig)
  return path


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
              color=_ink(im.cmap(im.norm(values[i, j]))))
  ax.set_title(title, fontsize=10)
  return _save(fig, path)


def _ink(rgba) -> str:
  """Black or white, whichever reads better on a cell of colour `rgba`."""
  r, g, b = rgba[:3]
  return 'black' if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else 'white'


def _save(fig, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
