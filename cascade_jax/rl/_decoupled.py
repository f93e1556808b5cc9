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
- `ThreadRollouts` (`rl.rollout_worker='thread'`) runs collection in a
  sampler thread of the learner's process, `max_staleness` steps ahead:
  XLA runs a program without the GIL, so the sampler's programs and its
  host work (rewards, sandbox runs) overlap the learner's update. With
  `rl.rollout_devices` = n (inline or thread) the sampler has devices of
  its own, the last n of the run's on a mesh of `rl.rollout_mesh`'s shape,
  and the learner's mesh the others; after each update the weight sync
  casts the weights on the learner's devices and copies them onto the
  sampler's, device to device (no host crossing).
- `ProcessRollouts` (`rl.rollout_worker='process'`, `rl._process`) runs
  collection (sample, score, filter, refill) in a sampler process of its
  own, which generates step t + 1 .. t + k's rollouts while the learner
  updates on step t, on one host or one a host; it shares this module's
  schedule, queue (`Ahead`) and worker loop (`sample_ahead`).

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

import abc
import contextlib
import dataclasses
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cascade_jax.rl._batch import RLBatch


def split_devices(n: int, devices=None):
  """(the learner's devices, the sampler's) for `rl.rollout_devices` = n:
  the sampler takes the last n of `devices` (default: the run's), the
  learner the others; (None, None) for 0 (one set of devices for both)."""
  if not n:
    return None, None
  devices = list(jax.devices() if devices is None else devices)
  if jax.process_count() > 1:
    raise ValueError(
        f'rl.rollout_devices={n} splits one process\'s devices; this run '
        f'has {jax.process_count()} processes (on several hosts '
        "rollout_worker='process' gives each host's sampler devices of its "
        'own: rl.rollout_env)')
  if n >= len(devices):
    raise ValueError(
        f'rl.rollout_devices={n} leaves the learner none of the run\'s '
        f'{len(devices)} device(s): at most {len(devices) - 1}')
  return devices[:-n], devices[-n:]


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
  cpu_s: float = 0.0    # the sampler process's CPU seconds for it (0 from
                        # a thread, whose XLA work runs on XLA's threads)
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
# The weight sync's copy of a sampler model onto the sampler's own devices.
Place = Callable[[nnx.Module], nnx.Module]


def own_model(sampler, state, place: Place | None = None, *,
              keep: bool = True) -> tuple[nnx.Module, float]:
  """The sampler's model of `state`, and the weight sync's seconds.

  `place`: the model copied onto the sampler's own devices (done when this
  returns). Otherwise, where the sampler keeps the model past the next
  update (`keep`), which donates the learner's arrays, each of its arrays
  that is one of the learner's (all where the sampler reads the learner's
  own; any a sync passed through unchanged) is copied on its devices."""
  t0 = time.perf_counter()
  model = sampler.model(state)
  if place is not None:
    model = place(model)
  elif keep:
    learners = {id(x) for x in jax.tree.leaves((state.params, state.rest))}
    graph, tree = nnx.split(model)
    model = nnx.merge(graph, jax.block_until_ready(jax.tree.map(
        lambda x: jnp.copy(x) if id(x) in learners else x, tree)))
  return model, time.perf_counter() - t0


class InlineRollouts:
  """Rollouts sampled in the learner's process when a step asks.

  Args:
    collect: (sampler model, step) -> (batch, stats): one step's collection.
    stream: the prompt stream (its position is the run's).
    sampler: the stage's `SamplerWeights`.
    max_staleness: k.
    steps: the stage's steps (nothing is sampled past them).
    place: the sampler's model copied onto its own devices
      (`rl.rollout_devices`; None: it samples on the learner's).
  """

  def __init__(self, collect: Collect, stream, sampler, max_staleness: int,
               steps: int, *, place: Place | None = None):
    self._collect, self.stream, self.sampler = collect, stream, sampler
    self.k, self.steps, self.place = max_staleness, steps, place
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
    # Kept past the next update (k > 0), which donates the learner's arrays.
    self._models[version], self.last_sync_s = own_model(
        self.sampler, state, self.place, keep=bool(self.k))
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


# ------------------------------------------------------------------- ahead


def sample_ahead(collect: Collect, stream, model_of, *, first: int,
                 floor: int, steps: int, k: int, inbox, outbox,
                 alive: Callable[[], bool], cpu_clock=time.process_time
                 ) -> None:
  """A sampler worker's loop (thread or process): weights in (`('weights',
  version, w)` on `inbox`, `model_of(w)` the model), each step's rollouts
  out in order from `first` (`('batch', Rollout)` on `outbox`), each by its
  `policy_version`. Returns on `('stop',)` or when `alive()` turns False
  while it waits."""
  models = {}
  for step in range(first, steps):
    version = policy_version(step, k, floor)
    while version not in models:
      try:
        msg = inbox.get(timeout=5.0)
      except queue.Empty:
        if not alive():   # nobody reads what it would send
          return
        continue
      if msg[0] == 'stop':
        return
      models[msg[1]] = msg[2]
    for v in [v for v in models if v < version]:
      del models[v]
    t0, c0 = time.perf_counter(), cpu_clock()
    batch, stats = collect(model_of(models[version]), step)
    outbox.put(('batch', Rollout(step, version, batch, stats,
                                 stream.position,
                                 cpu_s=cpu_clock() - c0,
                                 wall_s=time.perf_counter() - t0)))


class Ahead(abc.ABC):
  """A sampler worker `max_staleness` steps ahead of the learner: the
  batches it sends, read in step order."""

  what = 'worker'

  def __init__(self, sampler, max_staleness: int, steps: int,
               timeout_s: float):
    self.sampler, self.k, self.steps = sampler, max_staleness, steps
    self.timeout_s = timeout_s
    self._ready: dict[int, Rollout] = {}
    self._first = 0       # the step (weights version) the run started at
    self.last_sync_s = 0.0
    self.wait_s = 0.0     # the learner's last wait for a batch

  @abc.abstractmethod
  def _gone(self) -> str | None:
    """None while the worker runs; what became of it once it has ended."""

  def _begin(self, step: int, pending: list[Rollout]) -> None:
    """A run starting at `step` with the rollouts sampled ahead for it."""
    self._ready = {r.step: r for r in pending}
    self._first = step

  def _sends(self, version: int) -> bool:
    """Whether version `version`'s weights sample any step: version v
    samples steps v + k, or from the first step on for the first version a
    run starts with."""
    if version != self._first and version + self.k >= self.steps:
      self.last_sync_s = 0.0
      return False
    return True

  def _receive(self) -> Rollout:
    t0 = time.monotonic()
    while True:
      try:
        msg = self._from.get(timeout=1.0)
        break
      except queue.Empty:
        gone = self._gone()
        if gone:
          raise RuntimeError(f'rl: the sampler {self.what} ended without a '
                             f'batch ({gone})') from None
        if time.monotonic() - t0 > self.timeout_s:
          raise TimeoutError(f'rl: no batch from the sampler {self.what} in '
                             f'{self.timeout_s:.0f} s') from None
    if msg[0] == 'error':
      raise RuntimeError(f'rl: the sampler {self.what} failed:\n{msg[1]}')
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


# ------------------------------------------------------------------ thread


class ThreadRollouts(Ahead):
  """Collection in a sampler thread of the learner's process,
  `max_staleness` steps ahead.

  XLA runs a program without holding the GIL, so the sampler's programs
  (on its own devices, `place`, or beside the learner's on theirs) and
  its host work (rewards, sandbox runs, tokenizing) overlap the learner's
  update. The weights move once a step, as a model (`own_model`): on its
  own devices a device-to-device copy, no host crossing.

  Args:
    collect: (sampler model, step) -> (batch, stats), built for the
      sampler's devices (`_sampler_side.sampler_side`).
    stream: the sampler's prompt stream (each batch records its position).
    sampler: the stage's `SamplerWeights`.
    max_staleness: k.
    steps: the stage's steps.
    place: the sampler's model copied onto its own devices (None: it
      samples on the learner's).
    device: the sampler thread's default device (its devices' first).
    timeout_s: the longest wait for one batch before the learner gives up.
  """

  what = 'thread'

  def __init__(self, collect: Collect, stream, sampler, max_staleness: int,
               steps: int, *, place: Place | None = None, device=None,
               timeout_s: float = 3600.0):
    if jax.process_count() > 1:
      # Each process's two threads would launch their programs in an order
      # of their own, and a collective program launched in different
      # orders on different hosts can wait forever; on disjoint meshes too,
      # on the CPU's gloo collectives (docs/results/perf/decoupled_2026-12-06/
      # multihost_probe: two threads' all-reduces on two meshes hung).
      raise ValueError(
          "rl.rollout_worker='thread' runs in one process: on a run of "
          f'{jax.process_count()} processes the sampler\'s and the '
          "learner's programs would reach the hosts in different orders "
          "(use rollout_worker='process': a sampler process a host)")
    super().__init__(sampler, max_staleness, steps, timeout_s)
    self._collect, self.stream, self.place = collect, stream, place
    self.device = device
    self._thread = None
    self._stop = threading.Event()

  def start(self, step: int, state, pending: list[Rollout], position: int
            ) -> None:
    self._to, self._from = queue.Queue(), queue.Queue()
    self._begin(step, pending)
    self.stream.position = position
    self._thread = threading.Thread(
        target=self._main, kwargs=dict(first=step + len(pending), floor=step),
        name='cascade-rl-sampler', daemon=True)
    self._thread.start()
    self.publish(step, state)

  def _main(self, first: int, floor: int) -> None:
    try:
      # The thread's own placements (keys, prompts) on the sampler's
      # devices: JAX's default device is per thread.
      with (jax.default_device(self.device) if self.device is not None
            else contextlib.nullcontext()):
        sample_ahead(self._collect, self.stream, lambda m: m, first=first,
                     floor=floor, steps=self.steps, k=self.k, inbox=self._to,
                     outbox=self._from,
                     alive=lambda: not self._stop.is_set(),
                     cpu_clock=lambda: 0.0)
    except BaseException:  # pylint: disable=broad-except
      self._from.put(('error', traceback.format_exc()))

  def publish(self, version: int, state) -> None:
    if self._sends(version):
      model, self.last_sync_s = own_model(self.sampler, state, self.place)
      self._to.put(('weights', version, model))

  def _gone(self) -> str | None:
    return None if self._thread and self._thread.is_alive() else 'it ended'

  def close(self) -> None:
    """Stops the sampler thread once its step in hand is done (a thread
    cannot be ended from outside; it is a daemon, gone with the process)."""
    if self._thread is None:
      return
    self._stop.set()
    self._to.put(('stop',))
    self._thread.join(timeout=60.0)
    self._thread = None
