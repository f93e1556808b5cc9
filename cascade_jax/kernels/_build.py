"""Compiles the CPU kernels once per machine and registers them with XLA's FFI."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
from absl import logging

_DIR = pathlib.Path(__file__).parent
# One library: the kernels' sources and the header they share.
_SOURCES = (_DIR / 'moe_cpu.cc', _DIR / 'attention_cpu.cc',
            _DIR / 'argmax_cpu.cc')
_HEADERS = (_DIR / 'cpu_common.h',)
# FFI target name -> the handler symbol the library exports.
_TARGETS = {'cascade_jax_moe_ffn': 'CascadeJaxMoeFfn',
            'cascade_jax_cache_attention': 'CascadeJaxCacheAttention',
            'cascade_jax_argmax': 'CascadeJaxArgmax'}
DISABLE_ENV = 'CASCADE_JAX_CPU_KERNELS'  # '0': XLA's own ops everywhere
COMPILE_TIMEOUT_S = 120  # a compiler that hangs must not hang the run


def _cpu_signature() -> str:
  """What -march=native compiles for: a library built elsewhere may not run here."""
  try:
    for line in pathlib.Path('/proc/cpuinfo').read_text().splitlines():
      if line.startswith(('flags', 'Features')):
        return line
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _cache_dir() -> pathlib.Path:
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache')
  return pathlib.Path(root) / 'cascade_jax' / 'kernels'


def _compile(out: pathlib.Path) -> None:
  cxx = os.environ.get('CXX') or shutil.which('c++') or shutil.which('g++')
  if cxx is None:
    raise RuntimeError('no C++ compiler found (set CXX)')
  out.parent.mkdir(parents=True, exist_ok=True)
  errors = []
  with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
    lib = pathlib.Path(tmp) / out.name
    # Some compilers (Apple clang on arm64) take -mcpu=native, not -march.
    for arch in ('-march=native', '-mcpu=native'):
      cmd = [cxx, '-O3', arch, '-std=c++17', '-shared', '-fPIC',
             '-isystem', jax.ffi.include_dir(), *map(str, _SOURCES),
             '-o', str(lib)]
      try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=False,
                             timeout=COMPILE_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        errors.append(f'{" ".join(cmd)} took over {COMPILE_TIMEOUT_S}s')
        continue
      if res.returncode == 0:
        os.replace(lib, out)  # atomic: concurrent builders see no half file
        return
      errors.append(f'{" ".join(cmd)} failed:\n{res.stderr[:2000]}')
  raise RuntimeError('\n'.join(errors))


@functools.cache
def _library() -> ctypes.CDLL | None:
  """The kernels' library, built if needed and registered with XLA, or None.

  None when disabled (CASCADE_JAX_CPU_KERNELS=0) or when it cannot be built
  here (no compiler; a warning gives the compiler's error); callers then
  use XLA's ops. Built once (~5 s) and cached under
  $XDG_CACHE_HOME/cascade_jax/kernels (default ~/.cache), keyed by the
  sources, jaxlib's FFI headers and this CPU's features (-march=native).
  """
  if os.environ.get(DISABLE_ENV, '1').strip().lower() in ('0', 'off', 'false'):
    return None
  lib_path = cache_path('.so')
  try:
    if not lib_path.exists():
      t0 = time.perf_counter()
      print(f'cascade_jax: compiling the CPU kernels -> {lib_path} ...',
            flush=True)
      _compile(lib_path)
      print(f'cascade_jax: compiled the CPU kernels in '
            f'{time.perf_counter() - t0:.1f}s', flush=True)
    lib = ctypes.cdll.LoadLibrary(str(lib_path))
    for name, symbol in _TARGETS.items():
      jax.ffi.register_ffi_target(
          name, jax.ffi.pycapsule(getattr(lib, symbol)), platform='cpu')
  except (OSError, RuntimeError, subprocess.SubprocessError,
          AttributeError) as e:
    msg = f'cascade_jax: CPU kernels unavailable, using XLA ops ({e})'
    print(msg.splitlines()[0][:300], flush=True)
    logging.warning('%s', msg)
    return None
  return lib


@functools.cache
def built() -> bool:
  """Whether the kernels' library is built and registered here (it is
  built on first use; False when disabled or when it cannot be built)."""
  return _library() is not None


def _key() -> str:
  """The sources, jaxlib's FFI headers and this CPU's features, hashed."""
  key = hashlib.sha256()
  for source in _SOURCES + _HEADERS:
    key.update(source.read_bytes())
  for header in sorted(pathlib.Path(jax.ffi.include_dir()).rglob('*.h')):
    key.update(header.read_bytes())  # the FFI ABI the library is built for
  key.update(_cpu_signature().encode())
  return key.hexdigest()[:16]


def cache_path(suffix: str) -> pathlib.Path:
  """A file of this build in the cache: the library ('.so'), its calibration."""
  sep = '' if suffix.startswith('.') else '_'
  return _cache_dir() / f'cpu_kernels_{_key()}{sep}{suffix}'


def _known(name: str) -> None:
  if name not in _TARGETS:
    raise KeyError(f'no CPU kernel {name!r}; known: {sorted(_TARGETS)}')


def available(name: str, dtype) -> bool:
  """Whether kernel `name` (a key of _TARGETS) can run here: CPU backend, fp32, library built."""
  _known(name)
  return (jax.default_backend() == 'cpu' and
          jnp.dtype(dtype) == jnp.float32 and _library() is not None)


def target(name: str) -> str:
  """`name` (a key of _TARGETS), registered with XLA's FFI; an error if the library is unavailable."""
  _known(name)
  if _library() is None:
    raise RuntimeError(f'the CPU kernel {name} is unavailable here (see '
                       'the warning logged when it was first needed)')
  return name
