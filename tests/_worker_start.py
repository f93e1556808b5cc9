"""The start-up the multi-process test workers share; import it before jax.

  python tests/WORKER.py OUT.npz                    # one process, one device
  python tests/WORKER.py OUT.npz PROC NPROC PORT    # one of N processes

Each of the N processes gets 8 / N CPU devices and joins one
jax.distributed run on 127.0.0.1 (gloo collectives).
"""

import os
import sys

out_path = sys.argv[1]
distributed = len(sys.argv) > 2
proc, nproc = 0, 1
if distributed:
  proc, nproc, port = map(int, sys.argv[2:5])
  os.environ['XLA_FLAGS'] = (
      f'--xla_force_host_platform_device_count={8 // nproc}')
os.environ['JAX_PLATFORMS'] = 'cpu'

import jax  # pylint: disable=g-import-not-at-top

if distributed:
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(f'127.0.0.1:{port}', num_processes=nproc,
                             process_id=proc)
