"""Test set-up: 8 fake CPU devices for the sharding tests (before JAX starts)."""

import os

flags = os.environ.get('XLA_FLAGS', '')
if '--xla_force_host_platform_device_count' not in flags:
  os.environ['XLA_FLAGS'] = (
      flags + ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import gc

import pytest


@pytest.fixture(autouse=True, scope='module')
def _free_compiled_programs():
  """After each test file, drop JAX's compiled programs and traces.

  A test worker lives through hundreds of tests: without this its memory
  only grows, beside the multi-process tests that need room of their own.
  """
  yield
  import jax
  jax.clear_caches()
  gc.collect()
