"""One launch path for multi-host runs: `jax.distributed` from flags or the cluster's environment.

  auto     explicit flags if given (coordinator, process count, id); else a
           SLURM job with several tasks or a TPU pod slice of several hosts
           (jax.distributed.initialize() reads either from the environment);
           else a single process (nothing to start)
  on       as auto, but a single-process environment is an error
  off      never start it

On CPU the processes exchange collectives through gloo. Every process runs
the same program on the same data; each places its own shards, Orbax writes
checkpoints from all of them, and only process 0 writes other files.
"""

from __future__ import annotations

import os

import jax

MODES = ('auto', 'on', 'off')


def cluster_environment() -> str:
  """'slurm', 'tpu_pod' or '' from the environment (several hosts only)."""
  if int(os.environ.get('SLURM_NTASKS', os.environ.get('SLURM_NPROCS', '1'))
         or 1) > 1 and 'SLURM_JOB_ID' in os.environ:
    return 'slurm'
  hosts = [h for h in os.environ.get('TPU_WORKER_HOSTNAMES', '').split(',')
           if h.strip()]
  if len(hosts) > 1 or os.environ.get('MEGASCALE_COORDINATOR_ADDRESS'):
    return 'tpu_pod'
  return ''


def initialize(mode: str = 'auto', *, coordinator_address: str = '',
               num_processes: int = 0, process_id: int = -1,
               local_device_ids: str = '') -> str:
  """Starts jax.distributed as `mode` says; returns how ('' if not at all)."""
  if mode not in MODES:
    raise ValueError(f'distributed: mode {mode!r} not in {MODES}')
  if mode == 'off':
    return ''
  explicit = bool(coordinator_address)
  if explicit and (num_processes < 1 or process_id < 0):
    raise ValueError(
        'distributed: --coordinator_address needs --num_processes (>= 1) and '
        '--process_id (0 .. num_processes - 1)')
  if explicit and not 0 <= process_id < num_processes:
    raise ValueError(f'distributed: process_id {process_id} not in '
                     f'[0, {num_processes})')
  env = '' if explicit else cluster_environment()
  if not explicit and not env:
    if mode == 'on':
      raise ValueError(
          'distributed: --distributed=on, but no --coordinator_address and '
          'no SLURM job or TPU pod in the environment')
    return ''
  if jax.config.jax_platforms in ('cpu',) or os.environ.get(
      'JAX_PLATFORMS', '') == 'cpu':
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  kw = {}
  if explicit:
    kw = dict(coordinator_address=coordinator_address,
              num_processes=num_processes, process_id=process_id)
  if local_device_ids:
    kw['local_device_ids'] = [int(i) for i in local_device_ids.split(',')]
  jax.distributed.initialize(**kw)
  how = 'flags' if explicit else env
  print(f'[distributed] process {jax.process_index()} of '
        f'{jax.process_count()} ({how}): {jax.local_device_count()} local / '
        f'{jax.device_count()} devices', flush=True)
  return how
