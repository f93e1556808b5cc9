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

import jax
from absl import logging

_SOURCE = pathlib.Path(__file__).with_name('moe_cpu.cc')
DISABLE_ENV = 'CASCADE_JAX_CPU_KERNELS'  # '0': XLA's own ops everywhere


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
             '-isystem', jax.ffi.include_dir(), str(_SOURCE), '-o', str(lib)]
      res = subprocess.run(cmd, capture_output=True, text=True, check=False)
      if res.returncode == 0:
        os.replace(lib, out)  # atomic: concurrent builders see no half file
        return
      errors.append(f'{" ".join(cmd)} failed:\n{res.stderr[:2000]}')
  raise RuntimeError('\n'.join(errors))


@functools.cache
def moe_ffn_target() -> str | None:
  """The registered FFI target name of the sparse MoE kernel, or None.

  None when disabled (CASCADE_JAX_CPU_KERNELS=0) or when it cannot be built
  here (no compiler; a warning gives the compiler's error); callers then
  use XLA's ops. Built once (~3 s) and cached under
  $XDG_CACHE_HOME/cascade_jax/kernels (default ~/.cache), keyed by the
  source, jaxlib's FFI headers and this CPU's features (-march=native).
  """
  if os.environ.get(DISABLE_ENV, '1') == '0':
    return None
  key = hashlib.sha256()
  key.update(_SOURCE.read_bytes())
  for header in sorted(pathlib.Path(jax.ffi.include_dir()).rglob('*.h')):
    key.update(header.read_bytes())  # the FFI ABI the library is built for
  key.update(_cpu_signature().encode())
  lib_path = _cache_dir() / f'moe_cpu_{key.hexdigest()[:16]}.so'
  try:
    if not lib_path.exists():
      logging.info('cascade_jax: compiling the CPU MoE kernel -> %s', lib_path)
      _compile(lib_path)
    lib = ctypes.cdll.LoadLibrary(str(lib_path))
    name = 'cascade_jax_moe_ffn'
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(lib.CascadeJaxMoeFfn),
                                platform='cpu')
  except (OSError, RuntimeError, subprocess.SubprocessError) as e:
    logging.warning('cascade_jax: CPU MoE kernel unavailable, using XLA ops '
                    '(%s)', e)
    return None
  return name
