"""Helpers for tests that run stages in processes of their own and compare whole runs (a killed run against an uninterrupted one)."""

import json
import os
import socket

import jax
import numpy as np

from cascade_jax import checkpoint
from cascade_jax import train


def final_state(workdir, sft_dir):
  """An RL run's last checkpoint, restored as the stage builds its state (on
  one device, whatever mesh or processes wrote it): (step, the state's
  arrays on the host, the checkpoint's extra record)."""
  with open(os.path.join(workdir, 'config.json')) as f:
    optim = json.load(f)['optim']
  _, policy, _ = train.restore_run(sft_dir)
  _, state = train.init_state(policy, train.make_optimizer(
      train.OptimConfig(**optim)))
  # Onto this process's first device, whatever devices wrote it (a leaf
  # without a sharding would be restored onto the writer's).
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  like = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=one),
      state.to_checkpoint())
  ck = checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'))
  try:
    step = ck.latest_step()
    restored, extra = ck.restore(like)
  finally:
    ck.close()
  return step, jax.device_get(restored), extra


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(**overrides: str) -> dict[str, str]:
  """The environment for a process a test starts: this one's without its
  XLA_FLAGS (the test process's 8 fake devices are not the child's), the
  repository first on PYTHONPATH, then `overrides`."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
  env.update(overrides)
  return env


def free_port() -> int:
  """A port on 127.0.0.1 that nothing holds now (for a coordinator)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]
