"""When the CPU kernels run: never where they are slower than XLA's own ops.

The kernels (`cascade_jax.kernels`) were written for 16-float (AVX-512)
vectors; on an AVX2 EPYC they ran 2-5x slower than XLA's path (
one MoE decode step at batch 64, 6,880 us against 1,470 us), on an AVX-512
machine up to 2x faster. Their vectors and register blocks are now the
machine's (`cpu_common.h`), and on that AVX2 EPYC the sampler's step is
1.7-1.8 x faster with them than without
(docs/results/perf/cpu_kernels_avx2_2026-12-07); still, a machine can differ.
So, per kernel, CASCADE_JAX_CPU_KERNELS says:

- unset or 'auto' (the default): a calibration, run once per machine and
  kernel build (~30-60 s) and cached beside the library, times the
  sampler's own decode step on the main job's model with every subset of
  the kernels on, and keeps the fastest at decode batch 64 if it beats no
  kernels by at least 10 % there and is no slower at batch 8 (`_measure`);
- '1': every kernel that builds (tests, benchmarks);
- '0': none: XLA's ops alone, the path accelerator users run;
- a comma-separated list of ops ('moe_decode,argmax'): those kernels.

The decision is printed once per process, one line, with the figures.
A run records the kernels it used in its directory (`RECORD`,
`keep_run_kernels`), and a resumed run keeps them, whatever today's
calibration would say: the kernels and XLA round differently, so another
choice would make the resumed run end elsewhere.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import threading
import time

import jax
from absl import logging

from cascade_jax import kernels
from cascade_jax import utils
from cascade_jax.ops import _registry

ENV = kernels.DISABLE_ENV  # CASCADE_JAX_CPU_KERNELS
KERNEL_OPS = ('moe_decode', 'cache_attention', 'argmax')
# A kernel must beat XLA by this factor at every calibrated size.
MARGIN = 0.9
_CALIBRATION_VERSION = 4


def mode() -> str:
  """'auto', 'on', 'off' or 'list' (`listed()`), from CASCADE_JAX_CPU_KERNELS."""
  v = os.environ.get(ENV, 'auto').strip().lower()
  if v in ('', 'auto'):
    return 'auto'
  if v in ('1', 'on', 'true'):
    return 'on'
  if v in ('0', 'off', 'false'):
    return 'off'
  if set(v.split(',')) <= set(KERNEL_OPS):
    return 'list'
  raise ValueError(f'{ENV}={v!r}: use auto (the default), 1, 0 or a list of '
                   f'the kernels to run ({",".join(KERNEL_OPS)})')


def listed() -> frozenset:
  """The kernels CASCADE_JAX_CPU_KERNELS lists (mode 'list')."""
  return frozenset(os.environ.get(ENV, '').strip().lower().split(','))


def kernel_enabled(op: str) -> bool | str:
  """True if `op`'s CPU kernel may run here, else why not (for `ops.pick`).

  The CPU kernels are measured speed-ups over XLA, not the preferred path:
  running XLA without them is never a fallback in strict mode (the reasons
  are `elsewhere`).
  """
  ok = _kernel_enabled(op)
  return ok if ok is True else _registry.elsewhere(ok)


def _kernel_enabled(op: str) -> bool | str:
  if op not in KERNEL_OPS:
    raise ValueError(f'no CPU kernel for {op!r}; kernels: {KERNEL_OPS}')
  if _registry.backend() != 'cpu':
    return f'CPU kernels run on the CPU backend only ({_registry.backend()})'
  m = mode()
  if m == 'off':
    return f'{ENV}=0'
  if _CALIBRATING.is_set() and _registry.forced_choice(op) != 'cpu_kernel':
    return 'off while the kernels are calibrated'
  if not kernels.built():
    return 'the CPU kernels did not build here (see the message above)'
  if m == 'on' or _registry.forced_choice(op) == 'cpu_kernel':
    return True
  if m == 'list':
    return True if op in listed() else f'{ENV} does not list it'
  verdict = calibration()[op]
  return True if verdict['use'] else (
      f"slower than XLA here (calibrated: kernel {verdict['kernel_us']} us "
      f"vs xla {verdict['xla_us']} us)")


def _median_us(fn, *args, repeats: int) -> float:
  return utils.time_fn(fn, *args, repeats=repeats) * 1e6


_STEPS = 20   # each timed call runs 20 decode steps, as the sampler's loop does
BATCHES = (64, 8)   # the main job's decode batch (8 prompts x 8), then 8
_SLOTS = 256        # its cache: prompts of up to ~200 tokens + 48 new
_CALIBRATING = threading.Event()   # set while _measure runs (no recursion)


# The sampler's decode step for the calibration, registered by
# cascade_jax.rollout (which sits above ops: `register_decode_benchmark`).
_BENCHMARK: list = []


def register_decode_benchmark(make) -> None:
  """`make(batch, steps, slots) -> (fn, args)`: a new jitted function
  running `steps` of the sampler's decode step (the main job's model over a
  KV cache of `slots`) and its arguments; traced at its first call, under
  the kernels the calibration forces."""
  _BENCHMARK[:] = [make]


def _decode_steps(b: int, kernels_on: frozenset):
  """The registered decode step, traced and compiled with exactly
  `kernels_on`: (fn, args)."""
  if not _BENCHMARK:
    raise RuntimeError('no decode benchmark registered (cascade_jax.rollout '
                       'registers it on import)')
  fn, args = _BENCHMARK[0](b, _STEPS, _SLOTS)
  with _registry.forced(**{op: 'cpu_kernel' if op in kernels_on else 'xla'
                           for op in KERNEL_OPS}):
    jax.block_until_ready(fn(*args))   # traced and compiled here
  return fn, args


def _subsets():
  return [frozenset(o for j, o in enumerate(KERNEL_OPS) if i >> j & 1)
          for i in range(1 << len(KERNEL_OPS))]


def _time_all(runs: dict) -> dict:
  """Each run's best of two interleaved medians (drift hits all), us a step."""
  best = {c: float('inf') for c in runs}
  for _ in range(2):
    for c, (fn, args) in runs.items():
      best[c] = min(best[c], _median_us(fn, *args, repeats=3) / _STEPS)
  return best


def _measure() -> dict:
  """Times the sampler's decode step with every subset of the kernels on.

  The kernels interact (a kernel's layout, fusion across ops): timing each
  against a copy of its XLA path chose wrongly on an AVX-512 machine (all
  but one off, where all on was 1.7 x faster). So the decision is made on
  the step itself: the fastest subset at batch 64 that beats no kernels by
  10 % there and is no slower than no kernels (5 %) at batch 8; else none.
  """
  big, small = BATCHES
  none = frozenset()
  if not _BENCHMARK:
    # ops used without the sampler (nothing to time): no kernel, and not
    # cached, so that a process with the sampler decides.
    return {op: dict(use=False, kernel_us=[], xla_us=[], sizes=[])
            for op in KERNEL_OPS} | {'uncached': True}
  _CALIBRATING.set()
  try:
    with _registry.unrecorded():
      at_big = _time_all({c: _decode_steps(big, c) for c in _subsets()})
      chosen, at_small = none, {}
      for c in sorted(at_big, key=at_big.get):
        if not at_big[c] < MARGIN * at_big[none]:
          break
        at_small = _time_all({k: _decode_steps(small, k)
                              for k in (c, none)})
        if at_small[c] <= 1.05 * at_small[none]:
          chosen = c
          break
  finally:
    _CALIBRATING.clear()
  out = {op: dict(use=op in chosen,
                  kernel_us=[round(at_big[chosen | {op}], 1)],
                  xla_us=[round(at_big[chosen - {op}], 1)], sizes=[big])
         for op in KERNEL_OPS}
  name = lambda c: '+'.join(sorted(c)) or 'none'
  out['step_us'] = {f'{name(c)}@{big}': round(us, 1)
                    for c, us in at_big.items()}
  out['step_us'].update({f'{name(c)}@{small}': round(us, 1)
                         for c, us in at_small.items()})
  return out


@functools.cache
def calibration() -> dict:
  """op -> {use, kernel_us, xla_us, sizes}: measured once per machine and build, cached."""
  path = kernels.cache_path(f'calibration_v{_CALIBRATION_VERSION}.json')
  path.parent.mkdir(parents=True, exist_ok=True)
  result = None
  if path.exists():
    try:
      result = json.loads(path.read_text())
      if not set(KERNEL_OPS) <= set(result):
        result = None
    except (OSError, ValueError):
      result = None
  fresh = result is None
  if fresh:
    t0 = time.perf_counter()
    # Ops ask while the sampler is being traced: in this thread every array
    # op would be staged into that trace (and the timings would time
    # nothing). JAX's trace state is per thread, so measure in a fresh one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      result = pool.submit(_measure).result()
    if not result.get('uncached'):
      tmp = path.with_suffix(f'.tmp{os.getpid()}')
      tmp.write_text(json.dumps(result, indent=1))
      os.replace(tmp, path)
    took = time.perf_counter() - t0
  parts = [f"{op} {'kernel' if r['use'] else 'xla'} "
           f"({'/'.join(map(str, r['kernel_us']))} vs "
           f"{'/'.join(map(str, r['xla_us']))} us a step at batch "
           f"{'/'.join(map(str, r['sizes']))})"
           for op, r in result.items() if op in KERNEL_OPS]
  steps = result.get('step_us', {})
  every = f"{'+'.join(sorted(KERNEL_OPS))}@{BATCHES[0]}"
  if every in steps:
    parts.append(f'a step with all kernels {steps[every]} us, with none '
                 f"{steps[f'none@{BATCHES[0]}']} us at batch {BATCHES[0]}")
  msg = ('cascade_jax: CPU kernels, where the sampler\'s decode step is '
         'faster with them on this machine: ' + '; '.join(parts) +
         (f' [calibrated in {took:.1f}s' if fresh else ' [cached') +
         f', {path}; {ENV}=1 forces them, =0 turns them off]')
  print(msg, flush=True)
  logging.info(msg)
  return result


# ----------------------------------------------------- a run's own choice

RECORD = 'cpu_kernels.json'


def in_use() -> dict[str, bool] | None:
  """op -> whether its CPU kernel runs in this process (None off the CPU)."""
  if _registry.backend() != 'cpu':
    return None
  return {op: _kernel_enabled(op) is True for op in KERNEL_OPS}


def _spec(kernels_on: dict[str, bool]) -> str:
  on = [op for op in KERNEL_OPS if kernels_on.get(op)]
  return ','.join(on) if on else '0'


def keep_run_kernels(workdir: str) -> dict[str, bool] | None:
  """The CPU kernels of the run in `workdir`, this process pinned to them.

  A run started here records the kernels this process uses (`RECORD`: the
  choice, and the machine it was made on); a run resumed here reads its
  record and keeps it. Either way CASCADE_JAX_CPU_KERNELS is set to the
  choice, so that it does not change within the run and every process the
  run starts (its evaluation and sampler processes) makes it too. An
  explicit CASCADE_JAX_CPU_KERNELS that contradicts a run's record is an
  error: it would change the resumed run's numbers. None off the CPU.
  """
  if _registry.backend() != 'cpu':
    return None
  path = os.path.join(workdir, RECORD)
  if os.path.exists(path):
    with open(path) as f:
      rec = json.load(f)
    kept = {op: bool(rec['kernels'].get(op)) for op in KERNEL_OPS}
    if mode() != 'auto' and in_use() != kept:
      raise ValueError(
          f'{path}: this run used the CPU kernels {_spec(kept)!r} '
          f"({rec.get('machine', '?')}); {ENV}="
          f'{os.environ.get(ENV)!r} would run others and change its '
          f'numbers: unset it to resume, or start another workdir')
    os.environ[ENV] = _spec(kept)
    return kept
  kept = in_use()
  os.environ[ENV] = _spec(kept)
  if jax.process_index() == 0:
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w') as f:
      json.dump(dict(kernels=kept, machine=utils.cpu_model(),
                     vector_isa=utils.vector_isa()), f, indent=1)
    os.replace(tmp, path)
  return kept
