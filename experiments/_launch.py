"""Flags every stage launcher shares: the multi-host launch path (cascade_jax/utils/_distributed.py).

  # SLURM (one task per host; jax reads the job's environment):
  srun --ntasks-per-node=1 python -m experiments.cascade --workdir=/shared/run
  # TPU pod slice (the same command on every host):
  gcloud compute tpus tpu-vm ssh POD --worker=all --command \
      "python -m experiments.cascade --workdir=gs://bucket/run"
  # Anything else, explicitly (process 0's host is the coordinator):
  python -m experiments.cascade --coordinator_address=10.0.0.1:1234 \
      --num_processes=4 --process_id=$RANK --workdir=/shared/run
"""

from absl import flags

from cascade_jax import utils

_MODE = flags.DEFINE_enum('distributed', 'auto', ['auto', 'on', 'off'],
                          'Start jax.distributed: from the flags below, or a '
                          'SLURM job / TPU pod in the environment (auto).')
_COORD = flags.DEFINE_string('coordinator_address', '',
                             'host:port of process 0 (explicit launch).')
_NPROC = flags.DEFINE_integer('num_processes', 0, 'Processes in the run.')
_PID = flags.DEFINE_integer('process_id', -1, 'This process: 0 .. n - 1.')
_LOCAL = flags.DEFINE_string('local_device_ids', '',
                             'Comma-separated local devices of this process.')


def start() -> None:
  """Starts jax.distributed as the flags say (before anything uses JAX)."""
  utils.initialize_distributed(
      _MODE.value, coordinator_address=_COORD.value,
      num_processes=_NPROC.value, process_id=_PID.value,
      local_device_ids=_LOCAL.value)
