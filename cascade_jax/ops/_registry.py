"""Which implementation each op runs: picked per backend and dtype, recorded, forceable.

Every heavy op (`grouped_matmul`, `attention`, `cache_attention`,
`moe_decode`, `argmax`, `token_logprobs`, `ssd`) asks `pick` at trace time. `pick`
takes the first candidate that is available for the call (backend, dtype,
shapes) unless the op is forced, by `configure` (a config's `ops` section)
or the environment (CASCADE_JAX_OPS="attention=xla,grouped_matmul=tokamax"),
and records the choice, so that a run can say what it ran (`selected`).

A forced implementation that cannot run here is an error that names the
reason, not a silent fallback: a benchmark that asked for cuDNN must not
time XLA.

Strict mode (`set_strict(True)`, a config's `ops_strict`, or
CASCADE_JAX_OPS_STRICT=1) makes every fallback an error: when the backend's
preferred implementation refuses a call (a shape, a dtype) and a later one
would run, `pick` raises, naming the op, the call's shape and the reason.
A candidate that is not for this backend at all (cuDNN on a TPU), given as
`elsewhere(reason)`, is not a fallback. The plan compiles strict.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Iterator, Sequence

import jax

ENV = 'CASCADE_JAX_OPS'
STRICT_ENV = 'CASCADE_JAX_OPS_STRICT'
AUTO = 'auto'


class Elsewhere(str):
  """Why an implementation cannot run: it is not for this backend (not a fallback)."""


def elsewhere(reason: str) -> Elsewhere:
  return Elsewhere(reason)


class FallbackError(ValueError):
  """Strict mode: an op would leave its preferred implementation."""

# op -> its implementations; the first is the reference (plain JAX / XLA).
IMPLEMENTATIONS: dict[str, tuple[str, ...]] = {
    'grouped_matmul': ('xla', 'tokamax'),
    'attention': ('xla', 'cudnn', 'tokamax', 'splash'),
    'cache_attention': ('xla', 'cpu_kernel', 'xla_written', 'pallas'),
    'prefill_attention': ('cache', 'fused'),
    'moe_decode': ('xla', 'cpu_kernel'),
    'argmax': ('xla', 'cpu_kernel'),
    'token_logprobs': ('xla',),
    'ssd': ('xla',),
    'expert_exchange': ('all_gather', 'ragged_all_to_all',
                        'ragged_all_to_all_emulated'),
}

_lock = threading.Lock()
_thread = threading.local()
_forced: dict[str, str] = {}
_picked: dict[str, collections.Counter] = collections.defaultdict(
    collections.Counter)
_strict = [os.environ.get(STRICT_ENV, '') not in ('', '0')]


def set_strict(on: bool) -> None:
  """Strict mode on or off (see the module's docstring); at the next trace."""
  with _lock:
    _strict[0] = bool(on)


def strict() -> bool:
  with _lock:
    return _strict[0]


@contextlib.contextmanager
def strict_mode(on: bool = True) -> Iterator[None]:
  """`set_strict` for the duration of a with-block."""
  before = strict()
  set_strict(on)
  try:
    yield
  finally:
    set_strict(before)


def backend() -> str:
  """The platform ops compile for: the default device's (`jax.default_device`,
  e.g. an abstract TPU device for ahead-of-time compiles on a CPU host), else
  JAX's default backend."""
  dev = jax.config.jax_default_device
  platform = getattr(dev, 'platform', None)
  if platform is None and isinstance(dev, str):
    platform = dev
  return {'cuda': 'gpu', 'rocm': 'gpu'}.get(platform, platform) or (
      jax.default_backend())


def _check(op: str, name: str) -> None:
  if op not in IMPLEMENTATIONS:
    raise ValueError(f'ops: unknown op {op!r}; known: {sorted(IMPLEMENTATIONS)}')
  if name != AUTO and name not in IMPLEMENTATIONS[op]:
    raise ValueError(f'ops: {op} has no implementation {name!r}; choose '
                     f'from {(AUTO,) + IMPLEMENTATIONS[op]}')


def parse(spec: str) -> dict[str, str]:
  """'attention=xla,grouped_matmul=tokamax' -> {'attention': 'xla', ...}, checked."""
  out = {}
  for item in filter(None, (s.strip() for s in spec.split(','))):
    op, sep, name = item.partition('=')
    if not sep:
      raise ValueError(f'ops: {item!r} is not op=implementation (in {spec!r})')
    _check(op.strip(), name.strip())
    out[op.strip()] = name.strip()
  return out


def configure(**choices: str) -> None:
  """Forces implementations, e.g. configure(attention='xla'); 'auto' un-forces.

  Takes effect at the next trace: a function already jitted keeps the
  choice it was traced with.
  """
  for op, name in choices.items():
    _check(op, name)
  with _lock:
    for op, name in choices.items():
      if name == AUTO:
        _forced.pop(op, None)
      else:
        _forced[op] = name


@contextlib.contextmanager
def forced(**choices: str) -> Iterator[None]:
  """`configure` for the duration of a with-block (tests, benchmarks)."""
  with _lock:
    before = dict(_forced)
  configure(**choices)
  try:
    yield
  finally:
    with _lock:
      _forced.clear()
      _forced.update(before)


def configured() -> dict:
  """This process's forced choices and strict mode: {'choices': {op: name},
  'strict': bool}, for a process it starts (`configure(**choices)`,
  `set_strict(strict)` there)."""
  with _lock:
    return dict(choices=dict(_forced), strict=_strict[0])


def forced_choice(op: str) -> str:
  """The implementation `op` is forced to, or 'auto'."""
  _check(op, AUTO)
  with _lock:
    return _forced.get(op, AUTO)


def pick(op: str, candidates: Sequence[tuple[str, bool | str]], *,
         dtype=None, shape: str = '') -> str:
  """The implementation to run for this call, recorded.

  Args:
    op: a key of IMPLEMENTATIONS.
    candidates: (name, True or why it cannot run here) in order of
      preference; the reference ('xla') should come last as the fallback.
      A reason made by `elsewhere` says the implementation is not for this
      backend (strict mode does not count passing it as a fallback).
    dtype: the call's dtype, for the record.
    shape: the call's shapes, for strict mode's error.
  """
  _check(op, AUTO)
  want = forced_choice(op)
  why = dict(candidates)
  if want != AUTO:
    ok = why.get(want, 'not a candidate for this call')
    if ok is not True:
      raise ValueError(f'ops: {op} is forced to {want!r}, which cannot run '
                       f'here: {ok} (backend {jax.default_backend()}, '
                       f'dtype {dtype}); force another or set it to auto')
    name = want
  else:
    name = next((n for n, ok in candidates if ok is True), None)
    if name is None:
      raise ValueError(f'ops: no implementation of {op} can run here: {why}')
    if strict():
      _check_no_fallback(op, candidates, name, dtype, shape)
  if getattr(_thread, 'unrecorded', False):
    return name
  dt = 'any' if dtype is None else str(jax.numpy.dtype(dtype))
  with _lock:
    _picked[op][f'{name} ({backend()}, {dt})'] += 1
  return name


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
  """This thread's picks are not recorded in `selected` (the CPU kernels'
  calibration traces every choice; the run ran one)."""
  before = getattr(_thread, 'unrecorded', False)
  _thread.unrecorded = True
  try:
    yield
  finally:
    _thread.unrecorded = before


def _check_no_fallback(op, candidates, name, dtype, shape) -> None:
  for other, ok in candidates:
    if other == name:
      return
    if not isinstance(ok, Elsewhere):
      raise FallbackError(
          f'ops (strict): {op} would fall back from {other!r} to {name!r} '
          f'on {backend()} for {shape or "this call"} (dtype {dtype}): '
          f'{ok}. Pad the call to the kernel\'s blocks, or run without '
          f'strict mode ({STRICT_ENV}=0 / ops_strict=False) to accept the '
          f'fallback')


def selected() -> dict[str, list[str]]:
  """op -> the implementations picked so far in this process, as 'name (backend, dtype)'."""
  with _lock:
    return {op: sorted(c) for op, c in sorted(_picked.items())}


def reset_selected() -> None:
  with _lock:
    _picked.clear()


def _from_environment() -> None:
  spec = os.environ.get(ENV, '')
  if spec:
    configure(**parse(spec))


_from_environment()
