"""Launcher set-up: quiet library logs, a persistent XLA compilation cache."""

import os

import jax
from absl import flags
from absl import logging

CACHE_ENV = 'CASCADE_JAX_XLA_CACHE'


def quiet_logs() -> None:
  """Call at the top of an absl main: warnings and errors only, by default."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


def enable_compilation_cache() -> str | None:
  """XLA's persistent compilation cache, for a launcher: its directory, or None.

  The cascade compiles the same programs stage after stage (each stage's
  evaluation sampler, learner and teachers have the same shapes; only the
  weights differ, and they are arguments): with the cache, every stage after
  the first loads them instead of compiling, and a resumed or repeated run
  compiles nothing it compiled before. Default directory
  $XDG_CACHE_HOME/cascade_jax/xla (~/.cache); CASCADE_JAX_XLA_CACHE=<dir>
  moves it, =0 turns it off.

  Every program is kept, however quick its compile (JAX's default keeps
  those of a second or more): the small ones are most of a process's
  compiles (a stage's eager ops, initialisers, reshapes; 0.05-0.5 s each)
  and are compiled again by every process and after every
  `jax.clear_caches`. Loading one is a file read. Side by side on a 2-core
  Xeon (`pytest -n 2`): three test files 333 s against 373 and 384 s at
  0.5 s, six files 618 s against 631 s, the latter within the machine's
  drift (docs/results/perf/compile_2026-12-06).
  """
  path = os.environ.get(CACHE_ENV, '')
  if path.strip().lower() in ('0', 'off', 'false'):
    return None
  if not path:
    root = os.environ.get('XDG_CACHE_HOME') or os.path.join(
        os.path.expanduser('~'), '.cache')
    path = os.path.join(root, 'cascade_jax', 'xla')
  os.makedirs(path, exist_ok=True)
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  return path


_CHILD_SETTINGS = ('jax_compilation_cache_dir',
                   'jax_persistent_cache_min_compile_time_secs',
                   'jax_persistent_cache_min_entry_size_bytes',
                   'jax_num_cpu_devices')


def jax_settings() -> dict:
  """This process's JAX settings a helper process it spawns must take: the
  compilation cache, and the CPU device count where set in-process (not by
  XLA_FLAGS, which a child inherits). Apply with `apply_jax_settings`."""
  out = {k: getattr(jax.config, k, None) for k in _CHILD_SETTINGS}
  if out['jax_num_cpu_devices'] is not None and out['jax_num_cpu_devices'] < 0:
    del out['jax_num_cpu_devices']
  return out


def apply_jax_settings(settings: dict) -> None:
  """In a spawned process, before its first JAX computation."""
  for k, v in settings.items():
    if v is not None:
      jax.config.update(k, v)
