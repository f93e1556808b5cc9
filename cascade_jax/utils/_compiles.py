"""How much of a stretch of work went to compiling: XLA compiles, tracing, cache hits.

The main job's wall time on a CPU is a third compiles (2026-12-04: 248
backend compiles, 147 s of 709 s); this counts them per stage, from JAX's
own monitoring events, so a report says where they went:

  with utils.CompileCounter() as counted:
    ...
  counted.stats()   # {'compiles': 14, 'compile_s': 9.2, 'trace_s': 1.1, ...}
"""

from __future__ import annotations

import collections
import threading

from jax import monitoring

# JAX's event names (jax/_src/dispatch.py, compiler.py, compilation_cache.py).
_BACKEND = '/jax/core/compile/backend_compile_duration'
_TRACE = '/jax/core/compile/jaxpr_trace_duration'
_LOWER = '/jax/core/compile/jaxpr_to_mlir_module_duration'
_CACHE_HIT = '/jax/compilation_cache/cache_retrieval_time_sec'

_lock = threading.Lock()
_totals: collections.Counter = collections.Counter()
_counts: collections.Counter = collections.Counter()
_registered = False


def _listen(event: str, duration: float, **_) -> None:
  with _lock:
    _totals[event] += duration
    _counts[event] += 1


def _register() -> None:
  global _registered
  with _lock:
    if not _registered:   # one listener a process: JAX keeps them for good
      monitoring.register_event_duration_secs_listener(_listen)
      _registered = True


def _snapshot() -> tuple[dict, dict]:
  with _lock:
    return dict(_totals), dict(_counts)


class CompileCounter:
  """Counts the compiles (all threads) between `__enter__` and `__exit__`.

  `stats()`: compiles (XLA backend compiles, persistent-cache hits not
  included), compile_s (their seconds), trace_s (tracing and lowering to
  MLIR, which no cache skips), cache_hits (programs loaded from the
  persistent compilation cache). Inside the block it counts so far.
  """

  def __init__(self):
    _register()
    self._start = self._end = None

  def __enter__(self) -> CompileCounter:
    self._start, self._end = _snapshot(), None
    return self

  def __exit__(self, *exc) -> None:
    self._end = _snapshot()

  def stats(self) -> dict[str, float]:
    if self._start is None:
      raise RuntimeError('CompileCounter.stats: use it as a context manager '
                         'first (with CompileCounter() as c: ...)')
    (t1, c1), (t0, c0) = self._end or _snapshot(), self._start

    def d(table1, table0, event):
      return table1.get(event, 0) - table0.get(event, 0)
    return dict(
        compiles=int(d(c1, c0, _BACKEND)),
        compile_s=round(d(t1, t0, _BACKEND), 3),
        trace_s=round(d(t1, t0, _TRACE) + d(t1, t0, _LOWER), 3),
        cache_hits=int(d(c1, c0, _CACHE_HIT)))


def compile_seconds(compiles: dict[str, dict]) -> float:
  """Seconds of compiling and tracing in a record's `compiles` ({part:
  `CompileCounter.stats()`}, e.g. a cascade stage's train and eval)."""
  return sum(x['compile_s'] + x['trace_s'] for x in compiles.values())
