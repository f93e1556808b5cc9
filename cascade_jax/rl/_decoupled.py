"""Where an RL step's rollouts come from: the learner's own process, or a sampler process that runs ahead of it.

`rl.max_staleness` = k (default 0, the paper's strict on-policy) lets the
rollouts of step t be sampled by the policy of `policy_version(t, k)` =
max(t - k, 0), the weights after that many updates. The schedule is fixed,
not "the newest weights at hand": a run's batches do not depend on which
process was faster, so a decoupled run is as reproducible as a synchronous
one and resumes exactly.

- `InlineRollouts` (`rl.rollout_worker='inline'`) samples in the learner's
  process when a step asks. At k = 0 it is the synchronous loop (the
  sampler reads the learner's weights, `SamplerWeights`); at k > 0 it keeps
  the last k + 1 weight versions and samples step t from its version: the
  decoupled schedule without the overlap (a reference the process worker
  is tested against).
- `ProcessRollouts` (`rl.rollout_worker='process'`) runs collection (sample,
  score, filter, refill) in a sampler process of its own, which generates
  step t + 1 .. t + k's rollouts while the learner updates on step t. After
  each update the learner sends the sampler's copy of the weights (cast to
  `rl.sampler_dtype`) through host memory; the weight sync moves the model's
  parameters once a step, learner to sampler, and the batches move back
  (host arrays: tokens, masks, log-probs, routing). `rl.rollout_cpus` pins
  the sampler process to those CPU cores (before its XLA starts).

Every batch records the version it was sampled with; a batch older than
the bound (a checkpoint's queued rollouts resumed under a smaller
`max_staleness`) is dropped and counted (`stale_dropped`). The loss treats
a stale batch with the decoupled objective (AReaL's): the sampler's
log-probs are the behaviour policy, the current policy the proximal one
(`RLConfig.correction`, `Learner`).

A checkpoint at step s keeps the rollouts already sampled for steps s ..
s + k - 1 (their weights are gone from it), so a run killed and started
again samples nothing twice and ends where an uninterrupted run ends.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cascade_jax import model as model_lib
from cascade_jax import utils
from cascade_jax.rl._batch import RLBatch


def policy_version(step: int, max_staleness: int, floor: int = 0) -> int:
  """The weights (updates applied) that sample step `step`'s rollouts.

  `floor`: the oldest weights there are (a resumed run's first step: the
  earlier ones were not checkpointed), when a run resumes with a larger
  bound than it saved its queued rollouts under."""
  return max(step - max_staleness, floor, 0)


@dataclasses.dataclass
class Rollout:
  """One step's collected batch and where it came from."""
  step: int
  version: int          # the policy (updates applied) that sampled it
  batch: RLBatch
  stats: dict
  position: int         # the prompt stream's position after it
  cpu_s: float = 0.0    # the sampler process's CPU seconds for it
  wall_s: float = 0.0   # its collection's wall time


def drop_stale(r: Rollout, step: int, max_staleness: int
               ) -> tuple[RLBatch, int]:
  """(batch, rows dropped): a batch sampled more than `max_staleness`
  updates before `step` keeps its shape with nothing to learn from."""
  if step - r.version <= max_staleness:
    return r.batch, 0
  b = r.batch
  return b.replace(mask=np.zeros_like(b.mask), rewards=np.zeros_like(
      b.rewards), learn=False), b.num_rows


# ------------------------------------------------------------- checkpoints


def pending_path(workdir: str, step: int) -> str:
  return os.path.join(workdir, 'rollouts', f'step_{step}.pkl')


def save_pending(workdir: str, step: int, pending: list[Rollout]) -> str:
  """Writes the rollouts sampled for steps >= `step` (a checkpoint's);
  returns the file name the checkpoint records."""
  path = pending_path(workdir, step)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + '.tmp', 'wb') as f:
    pickle.dump(pending, f)   # host arrays (`collect`'s batches)
  os.replace(path + '.tmp', path)
  return os.path.basename(path)


def load_pending(workdir: str, name: str) -> list[Rollout]:
  path = os.path.join(workdir, 'rollouts', name)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'rl: the checkpoint names the rollouts it queued, {path}, which is '
        'missing: a decoupled run cannot resume exactly without them')
  with open(path, 'rb') as f:
    return pickle.load(f)


def prune_pending(workdir: str, keep_steps) -> None:
  """Removes queued-rollout files of checkpoints that are gone."""
  d = os.path.join(workdir, 'rollouts')
  if not os.path.isdir(d):
    return
  keep = {f'step_{s}.pkl' for s in keep_steps}
  for name in os.listdir(d):
    if name.endswith('.pkl') and name not in keep:
      os.remove(os.path.join(d, name))


# ------------------------------------------------------------------ inline


Collect = Callable[[nnx.Module, int], tuple[RLBatch, dict]]


class InlineRollouts:
  """Rollouts sampled in the learner's process when a step asks.

  Args:
    collect: (sampler model, step) -> (batch, stats): one step's collection.
    stream: the prompt stream (its position is the run's).
    sampler: the stage's `SamplerWeights`.
    max_staleness: k.
    steps: the stage's steps (nothing is sampled past them).
  """

  def __init__(self, collect: Collect, stream, sampler, max_staleness: int,
               steps: int):
    self._collect, self.stream, self.sampler = collect, stream, sampler
    self.k, self.steps = max_staleness, steps
    self._models: dict[int, nnx.Module] = {}
    self._ready: dict[int, Rollout] = {}
    self._floor = 0
    self.last_sync_s = 0.0

  def start(self, step: int, state, pending: list[Rollout], position: int
            ) -> None:
    self._ready = {r.step: r for r in pending}
    self.stream.position = position
    self._floor = step
    self.publish(step, state)

  def publish(self, version: int, state) -> None:
    """The weights after `version` updates are the sampler's from now."""
    model = self.sampler.model(state)
    self.last_sync_s = self.sampler.last_sync_s
    if self.k:   # kept past the next update, which donates the learner's
      graph, tree = nnx.split(model)
      model = nnx.merge(graph, jax.tree.map(jnp.copy, tree))
    self._models[version] = model
    for v in [v for v in self._models if v < version - self.k]:
      del self._models[v]

  def _sample(self, step: int) -> Rollout:
    version = policy_version(step, self.k, self._floor)
    if version not in self._models:
      raise RuntimeError(f'rl: step {step} is sampled by weights version '
                         f'{version}, which is gone')
    t0 = time.perf_counter()
    batch, stats = self._collect(self._models[version], step)
    return Rollout(step, version, batch, stats, self.stream.position,
                   wall_s=time.perf_counter() - t0)

  def get(self, step: int) -> Rollout:
    return self._ready.pop(step, None) or self._sample(step)

  def pending(self, step: int) -> list[Rollout]:
    """The rollouts of steps `step` .. `step` + k - 1, sampled now if not yet."""
    for s in range(step, min(step + self.k, self.steps)):
      if s not in self._ready:
        self._ready[s] = self._sample(s)
    return [self._ready[s] for s in sorted(self._ready) if s >= step]

  def close(self) -> None:
    self._models.clear()


# ----------------------------------------------------------------- process


def _weights(sampler, state) -> tuple[list[np.ndarray], float]:
  """The sampler's copy of the weights as host arrays, and the seconds."""
  t0 = time.perf_counter()
  model = sampler.model(state)
  _, params, rest = nnx.split(model, nnx.Param, ...)
  # One array a layer (the weight sync's layout; a learner's stacked arrays,
  # where nothing was copied, split on the host), as `sampler_side` takes them.
  tree = model_lib.split_layers(jax.device_get((params, rest)))
  return [np.asarray(x) for x in jax.tree.leaves(tree)], time.perf_counter() - t0


class ProcessRollouts:
  """Collection in a sampler process of its own, `max_staleness` steps ahead.

  Args:
    config: the stage's config (the worker builds its prompt stream, rewards
      and sampler model from it, as the stage does).
    workdir: the stage's directory.
    sampler: the stage's `SamplerWeights` (the copy sent after each update).
    max_staleness: k.
    steps: the stage's steps.
    cpus: CPU cores the sampler process is pinned to (None: any).
    timeout_s: the longest wait for one batch before the learner gives up.
  """

  def __init__(self, config, workdir: str, sampler, max_staleness: int,
               steps: int, *, cpus: tuple[int, ...] | None = None,
               timeout_s: float = 3600.0):
    if jax.process_count() > 1:
      raise ValueError(
          "rl.rollout_worker='process' runs one sampler process beside one "
          f'learner process; this run has {jax.process_count()} processes '
          "(use rollout_worker='inline' on a multi-host run)")
    self.config, self.workdir, self.sampler = config, workdir, sampler
    self.k, self.steps, self.cpus, self.timeout_s = (max_staleness, steps,
                                                     cpus, timeout_s)
    self._ready: dict[int, Rollout] = {}
    self._proc = None
    self._first = 0       # the step (weights version) the run started at
    self.last_sync_s = 0.0
    self.wait_s = 0.0     # the learner's last wait for a batch

  def start(self, step: int, state, pending: list[Rollout], position: int
            ) -> None:
    ctx = multiprocessing.get_context('spawn')
    self._to, self._from = ctx.Queue(), ctx.Queue()
    self._ready = {r.step: r for r in pending}
    self._first = step
    job = dict(config=self.config.to_dict(), workdir=self.workdir,
               first=step + len(pending), floor=step, position=position,
               k=self.k,
               steps=self.steps, cpus=self.cpus,
               settings=utils.jax_settings())
    self._proc = ctx.Process(target=_worker_main, args=(job, self._to,
                                                        self._from),
                             name='cascade-rl-sampler', daemon=True)
    self._proc.start()
    self.publish(step, state)

  def publish(self, version: int, state) -> None:
    # Version v samples steps v + k, or from the first step on for the
    # first version a run starts with.
    if version != self._first and version + self.k >= self.steps:
      self.last_sync_s = 0.0
      return
    leaves, self.last_sync_s = _weights(self.sampler, state)
    self._to.put(('weights', version, leaves))

  def _receive(self) -> Rollout:
    t0 = time.monotonic()
    while True:
      try:
        msg = self._from.get(timeout=1.0)
        break
      except queue.Empty:
        if not self._proc.is_alive():
          raise RuntimeError(
              f'rl: the sampler process died (exit code '
              f'{self._proc.exitcode}) without a batch') from None
        if time.monotonic() - t0 > self.timeout_s:
          raise TimeoutError(f'rl: no batch from the sampler process in '
                             f'{self.timeout_s:.0f} s') from None
    if msg[0] == 'error':
      raise RuntimeError(f'rl: the sampler process failed:\n{msg[1]}')
    return msg[1]

  def _until(self, step: int) -> None:
    while step not in self._ready:
      r = self._receive()
      self._ready[r.step] = r

  def get(self, step: int) -> Rollout:
    t0 = time.perf_counter()
    self._until(step)
    self.wait_s = time.perf_counter() - t0
    return self._ready.pop(step)

  def pending(self, step: int) -> list[Rollout]:
    for s in range(step, min(step + self.k, self.steps)):
      self._until(s)
    return [self._ready[s] for s in sorted(self._ready) if s >= step]

  def close(self) -> None:
    """Stops the sampler process (reading what it still sends, so that it
    can exit), then ends it if it has not within 30 s."""
    if self._proc is None:
      return
    utils.stop_process(self._proc, self._to, self._from)
    self._proc = None


def _worker_main(job: dict, inbox, outbox) -> None:
  """The sampler process: weights in, one step's rollouts out, in order."""
  try:
    if job['cpus']:
      os.sched_setaffinity(0, set(job['cpus']))   # before XLA starts
    utils.apply_jax_settings(job['settings'])
    _worker_loop(job, inbox, outbox)
  except BaseException:  # pylint: disable=broad-except
    outbox.put(('error', traceback.format_exc()))
    raise


def _worker_loop(job, inbox, outbox) -> None:
  import ml_collections  # pylint: disable=g-import-not-at-top
  from cascade_jax.rl import _stage  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict(job['config'])
  collect, stream, model_of = _stage.sampler_side(config, job['workdir'])
  stream.position = job['position']
  k, models, parent = job['k'], {}, os.getppid()
  for step in range(job['first'], job['steps']):
    version = policy_version(step, k, job['floor'])
    while version not in models:
      try:
        msg = inbox.get(timeout=5.0)
      except queue.Empty:
        if os.getppid() != parent:   # the learner was killed: nobody reads
          outbox.cancel_join_thread()
          return
        continue
      if msg[0] == 'stop':
        return
      models[msg[1]] = msg[2]
    for v in [v for v in models if v < version]:
      del models[v]
    t0, c0 = time.perf_counter(), time.process_time()
    batch, stats = collect(model_of(models[version]), step)
    outbox.put(('batch', Rollout(step, version, batch, stats,
                                 stream.position,
                                 cpu_s=time.process_time() - c0,
                                 wall_s=time.perf_counter() - t0)))
