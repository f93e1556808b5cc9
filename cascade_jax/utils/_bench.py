"""Wall-clock timing of jitted functions, plain-text tables, and a benchmark's results on disk."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence

import jax


def time_fn(fn: Callable, *args, repeats: int = 5) -> float:
  """Median seconds per call of `fn(*args)`, after one compiling call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def format_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
  """A fixed-width table; floats get 3 significant digits."""
  def fmt(v):
    return f'{v:.3g}' if isinstance(v, float) else str(v)
  cells = [list(map(str, header))] + [[fmt(v) for v in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  lines = ['  '.join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


def write_results(workdir: str, config, results) -> None:
  """Writes a benchmark's resolved `config` (a ConfigDict), its `results`
  and the run's `provenance()` (commit, command, machine) as JSON into
  `workdir`."""
  from cascade_jax.utils import _provenance  # pylint: disable=g-import-not-at-top
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(config.to_json_best_effort(indent=2))
  with open(os.path.join(workdir, 'results.json'), 'w') as f:
    json.dump(results, f, indent=2)
  with open(os.path.join(workdir, 'provenance.json'), 'w') as f:
    json.dump(_provenance.provenance(), f, indent=2)
