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
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  return path
