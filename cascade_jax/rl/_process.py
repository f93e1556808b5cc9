"""The sampler process (`rl.rollout_worker='process'`): collection in a process of its own, `max_staleness` steps ahead of the learner.

After each update the learner sends the sampler's copy of the weights (cast
to `rl.sampler_dtype`) through host memory; the weight sync moves the
model's parameters once a step, learner to sampler, and the batches move
back (host arrays: tokens, masks, log-probs, routing). `rl.rollout_cpus`
pins the process to CPU cores and `rl.rollout_env` sets its environment
(its own accelerators), both before its XLA starts. On a run of several
processes each learner process starts one beside it; the sampler processes
form a jax.distributed run of their own (`sampler_cluster`) on a mesh of
their own (`rl.rollout_mesh`, or the learner's shape), and each is sent its
learner process's shards of the weights (`Shards`), from which it cuts its
blocks: nothing crosses between hosts. The schedule, the queue and the
worker loop are `_decoupled`'s, shared with the sampler thread.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import socket
import time
import traceback

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from cascade_jax import model as model_lib
from cascade_jax import utils
from cascade_jax.rl._decoupled import Ahead
from cascade_jax.rl._decoupled import Rollout
from cascade_jax.rl._decoupled import sample_ahead
from cascade_jax.rl._sampler_side import sampler_side
from cascade_jax.rl._shards import Shards


def _weights(sampler, state) -> tuple[list, float]:
  """The sampler's copy of the weights as host arrays (`Shards` of this
  process's part where a weight spans several processes), and the seconds."""
  t0 = time.perf_counter()
  model = sampler.model(state)
  _, params, rest = nnx.split(model, nnx.Param, ...)
  # One array a layer (the weight sync's layout; a learner's stacked arrays,
  # where nothing was copied, split on the host), as `sampler_side` takes them.
  if jax.process_count() == 1:
    tree = model_lib.split_layers(jax.device_get((params, rest)))
    leaves = [np.asarray(x) for x in jax.tree.leaves(tree)]
  else:
    leaves = [x if not isinstance(x, jax.Array) else
              np.asarray(x) if x.is_fully_addressable else Shards.local(x)
              for x in jax.tree.leaves(model_lib.split_layers((params, rest)))]
  return leaves, time.perf_counter() - t0


class ProcessRollouts(Ahead):
  """Collection in a sampler process of its own, `max_staleness` steps ahead.

  Args:
    config: the stage's config (the worker builds its prompt stream, rewards
      and sampler model from it, as the stage does).
    workdir: the stage's directory.
    sampler: the stage's `SamplerWeights` (the copy sent after each update).
    max_staleness: k.
    steps: the stage's steps.
    cpus: CPU cores the sampler process is pinned to (None: any).
    coordinator: on several processes, 'host:port' of the sampler
      processes' own jax.distributed run ('': `sampler_cluster`'s default).
    env: environment variables the sampler process starts with.
    timeout_s: the longest wait for one batch before the learner gives up.
  """

  what = 'process'

  def __init__(self, config, workdir: str, sampler, max_staleness: int,
               steps: int, *, cpus: tuple[int, ...] | None = None,
               coordinator: str = '', env: dict[str, str] | None = None,
               timeout_s: float = 3600.0):
    super().__init__(sampler, max_staleness, steps, timeout_s)
    self.config, self.workdir, self.cpus = config, workdir, cpus
    self.env = dict(env or {})
    self.cluster = sampler_cluster(coordinator)
    self._proc = None

  def start(self, step: int, state, pending: list[Rollout], position: int
            ) -> None:
    ctx = multiprocessing.get_context('spawn')
    self._to, self._from = ctx.Queue(), ctx.Queue()
    self._begin(step, pending)
    job = dict(config=self.config.to_dict(), workdir=self.workdir,
               first=step + len(pending), floor=step, position=position,
               k=self.k,
               steps=self.steps, cpus=self.cpus, cluster=self.cluster,
               env=self.env,
               settings=utils.jax_settings())
    self._proc = ctx.Process(target=_worker_main, args=(job, self._to,
                                                        self._from),
                             name='cascade-rl-sampler', daemon=True)
    self._proc.start()
    self.publish(step, state)

  def publish(self, version: int, state) -> None:
    if self._sends(version):
      leaves, self.last_sync_s = _weights(self.sampler, state)
      self._to.put(('weights', version, leaves))

  def _gone(self) -> str | None:
    return (None if self._proc.is_alive() else
            f'it died, exit code {self._proc.exitcode}')

  def close(self) -> None:
    """Stops the sampler process (reading what it still sends, so that it
    can exit), then ends it if it has not within 30 s."""
    if self._proc is None:
      return
    utils.stop_process(self._proc, self._to, self._from)
    self._proc = None


def sampler_cluster(coordinator: str = '') -> dict | None:
  """On a run of several processes, the jax.distributed run the sampler
  processes form (one a host, beside each learner process): its
  coordinator (`coordinator`, or the learner's coordinator's host at its
  port + 1), size and this process's index in it, as
  `utils.initialize_distributed` takes them. None on one process."""
  if jax.process_count() == 1:
    return None
  if not coordinator:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    host, _, port = (distributed.global_state.coordinator_address or
                     '').rpartition(':')
    if not port.isdigit():
      raise ValueError(
          'rl: the learner\'s jax.distributed coordinator is not known here; '
          "give the sampler processes' own as rl.rollout_coordinator "
          "('host:port')")
    coordinator = f'{host}:{int(port) + 1}'
  # Its coordinator runs beside process 0's learner, which checks the port
  # now: taken, every process says so here, where jax.distributed's own
  # start would wait out its timeout and abort ('another task died').
  if _agree(jax.process_index() == 0 and port_in_use(coordinator)):
    raise ValueError(
        f"rl: the sampler processes' coordinator {coordinator} (rl."
        "rollout_coordinator, default the learner's coordinator port + 1) "
        "cannot listen: the port is taken on process 0's host (a service of "
        "its own, or the sampler processes of a run that was killed); give "
        "rl.rollout_coordinator='host:port' a free port")
  return dict(coordinator_address=coordinator,
              num_processes=jax.process_count(),
              process_id=jax.process_index())


def port_in_use(address: str) -> bool:
  """Whether this host cannot listen on the port of `address`
  ('host:port'), bound as jax.distributed's coordinator binds it (every
  interface; a port in TIME_WAIT is free)."""
  port = int(address.rpartition(':')[2])
  for family, host in ((socket.AF_INET6, '::'), (socket.AF_INET, '')):
    try:
      s = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      continue   # no IPv6 on this host
    with s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        s.bind((host, port))
      except OSError as e:
        if e.errno == errno.EADDRINUSE:
          return True
        continue   # this family cannot bind here: the next
      return False
  return False


def _agree(flag: bool) -> bool:
  """Process 0's `flag`, on every process."""
  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def _worker_main(job: dict, inbox, outbox) -> None:
  """The sampler process: weights in, one step's rollouts out, in order."""
  try:
    os.environ.update(job['env'])   # before XLA starts, as the affinity
    if job['cpus']:
      os.sched_setaffinity(0, set(job['cpus']))
    utils.apply_jax_settings(job['settings'])
    if job['cluster']:   # the sampler processes' own run, one a host
      utils.initialize_distributed('on', **job['cluster'])
    print(f'[rl] the sampler process: {jax.local_device_count()} '
          f'{jax.default_backend()} device(s) of {jax.device_count()}' + (
              f', environment {job["env"]}' if job['env'] else ''),
          flush=True)
    _worker_loop(job, inbox, outbox)
  except BaseException:  # pylint: disable=broad-except
    outbox.put(('error', traceback.format_exc()))
    raise


def _worker_loop(job, inbox, outbox) -> None:
  config = ml_collections.ConfigDict(job['config'])
  collect, stream, model_of = sampler_side(config, job['workdir'])
  stream.position = job['position']
  parent = os.getppid()
  sample_ahead(collect, stream, model_of, first=job['first'],
               floor=job['floor'], steps=job['steps'], k=job['k'],
               inbox=inbox, outbox=outbox,
               alive=lambda: os.getppid() == parent)
  if os.getppid() != parent:   # the learner was killed: nobody reads
    outbox.cancel_join_thread()
