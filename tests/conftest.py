"""Test set-up: 8 fake CPU devices for the sharding tests (before JAX starts)."""

import os

flags = os.environ.get('XLA_FLAGS', '')
if '--xla_force_host_platform_device_count' not in flags:
  os.environ['XLA_FLAGS'] = (
      flags + ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
