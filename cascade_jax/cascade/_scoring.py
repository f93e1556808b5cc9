"""Scoring a finished stage on every domain: in the cascade's process, or in an evaluation process beside its training.

A stage's scores (every domain's eval split on its final checkpoint) need
nothing from the stages after it, and the next stage's training needs
nothing from them, so the cascade can train stage k + 1 while stage k is
scored. On a single-process CPU run (the laptop main job) the training
leaves a core idle during every compile, reward, sandbox run and host step,
which the evaluation then fills (`config.eval_worker`):

- 'inline': scored in the cascade's process, right after its training
  (a multi-host run, and an accelerator run, whose devices the training
  holds);
- 'process': scored in order, one stage at a time, by one evaluation
  process (at a lower priority, `NICE`) started at the first stage to
  score; the cascade writes a
  stage's record (`stage.json`) when its scores arrive and waits for the
  last before its report;
- 'auto' (the default): 'process' on a single-process CPU run whose
  evaluation is large enough to pay for a process (`AUTO_MIN_SAMPLES`),
  else 'inline'.

Both score with the same function on the same checkpoint, prompts and
sampling keys, so they give the same scores (tested). A cascade killed
while a stage is trained but not yet scored has no `stage.json` for it:
started again, it resumes the stage's (finished) run and scores it.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback

import jax
import ml_collections

from cascade_jax import ops
from cascade_jax import rollout
from cascade_jax import train
from cascade_jax import utils

WORKERS = ('auto', 'inline', 'process')
# 'auto' takes the process when a domain's evaluation samples at least this
# many responses (eval_n x eval_samples; the main job: 512). The process
# costs its start (imports) and compiles the evaluation's programs apart
# from the training's: the recipe notebook's quick cascade (8 prompts x 2)
# took 117 s with it in the test suite, against 88 s inline.
AUTO_MIN_SAMPLES = 64
# The evaluation process's niceness: the training is the run's critical
# path, so the scheduler gives it the cores first and the evaluation what
# the training leaves idle (compiles, rewards, sandbox runs, host steps).
NICE = 10


def score_stage(run_dir: str, evals, *, temperature: float = 0.0,
                samples: int = 1, seed: int = 0,
                config: ml_collections.ConfigDict | None = None
                ) -> dict[str, dict]:
  """Every domain's eval split on the stage's final checkpoint (on the
  cascade `config`'s mesh, when given)."""
  ctx = None if config is None else train.mesh_ctx(config)
  memory = None if config is None else train.memory_overrides(config)
  _, model, tok = train.restore_run(run_dir, ctx=ctx, memory=memory)
  episodes = None if config is None else config.get('episodes')
  scores = rollout.evaluate_model(
      model, tok, evals, temperature=temperature, samples=samples, seed=seed,
      episodes=episodes.to_dict() if episodes else None)
  return {d: dict(pass_rate=s.pass_rate, mean_reward=s.mean_reward, n=s.n,
                 prompts=s.n // samples, pass_se=s.pass_se,
                 prompt_pass=dict(s.prompt_pass),
                 **(dict(by_check=dict(s.by_check)) if s.by_check else {}))
          for d, s in scores.items()}


def scored(config: ml_collections.ConfigDict, run_dir: str, evals) -> dict:
  """One stage scored as the cascade records it: scores, eval_s, compiles
  (`utils.CompileCounter.stats()`) and the ops it picked."""
  ops.reset_selected()
  t0 = time.perf_counter()
  with utils.CompileCounter() as compiles:
    scores = score_stage(run_dir, evals, temperature=config.eval_temperature,
                         samples=config.eval_samples, seed=config.seed,
                         config=config)
  return dict(scores=scores, eval_s=time.perf_counter() - t0,
              compiles=compiles.stats(), ops=ops.selected())


def worker_kind(config: ml_collections.ConfigDict) -> str:
  """'inline' or 'process': `config.eval_worker`, 'auto' resolved."""
  kind = config.get('eval_worker', 'auto') or 'auto'
  if kind not in WORKERS:
    raise ValueError(f'eval_worker: {kind!r} not in {WORKERS}')
  if kind == 'process' and jax.process_count() > 1:
    raise ValueError(
        "eval_worker='process' scores beside a single-process run; this run "
        f"has {jax.process_count()} processes (use eval_worker='inline')")
  if kind == 'auto':
    samples = int(config.get('eval_n', 0)) * int(config.get('eval_samples', 1))
    kind = ('process' if jax.process_count() == 1
            and jax.default_backend() == 'cpu'
            and samples >= AUTO_MIN_SAMPLES else 'inline')
  return kind


def eval_cpus(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  """`config.eval_cpus` ('1' or '2,3'): the cores the evaluation process
  is pinned to; () for any."""
  spec = str(config.get('eval_cpus', '') or '')
  try:
    cpus = tuple(int(c) for c in spec.split(',') if c.strip())
  except ValueError:
    raise ValueError(f'eval_cpus: {spec!r} is not a comma-separated list of '
                     'CPU numbers') from None
  missing = set(cpus) - os.sched_getaffinity(0)
  if missing:
    raise ValueError(f'eval_cpus: CPUs {sorted(missing)} are not among this '
                     f'process\'s {sorted(os.sched_getaffinity(0))}')
  return cpus


def make(config: ml_collections.ConfigDict, evals):
  """The cascade's evaluator for `config.eval_worker`."""
  cpus = eval_cpus(config)
  if worker_kind(config) == 'inline':
    if cpus:
      raise ValueError("eval_cpus pins the evaluation process: it needs "
                       "eval_worker='process' (or 'auto' on a CPU run)")
    return InlineScoring(config, evals)
  return ProcessScoring(config, evals, cpus=cpus)


class InlineScoring:
  """Scores each stage when it is submitted, in this process."""

  def __init__(self, config, evals):
    self.config, self.evals = config, evals
    self._done: list[tuple[str, dict]] = []

  def submit(self, name: str, run_dir: str) -> None:
    self._done.append((name, scored(self.config, run_dir, self.evals)))

  def ready(self, wait: bool = False) -> list[tuple[str, dict]]:
    """The stages scored since the last call: [(name, `scored`'s record)]."""
    del wait
    out, self._done = self._done, []
    return out

  def close(self) -> None:
    pass


class ProcessScoring:
  """Scores stages in order in one evaluation process of its own.

  `timeout_s`: the longest wait for one stage's scores (a stuck process
  is an error, not a hang).
  """

  def __init__(self, config, evals, timeout_s: float = 3600.0,
               cpus: tuple[int, ...] = ()):
    self.config, self.evals, self.timeout_s = config, evals, timeout_s
    self.cpus = cpus
    self._proc = None
    self._waiting: list[str] = []

  def _start(self) -> None:
    ctx = multiprocessing.get_context('spawn')
    self._to, self._from = ctx.Queue(), ctx.Queue()
    job = dict(config=self.config.to_dict(), evals=self.evals,
               settings=utils.jax_settings(), ops=ops.configured(),
               cpus=self.cpus)
    self._proc = ctx.Process(target=_worker_main,
                             args=(job, self._to, self._from),
                             name='cascade-eval', daemon=True)
    self._proc.start()

  def submit(self, name: str, run_dir: str) -> None:
    if self._proc is None:
      self._start()
    self._to.put(('score', name, os.path.abspath(run_dir)))
    self._waiting.append(name)

  def ready(self, wait: bool = False) -> list[tuple[str, dict]]:
    """The stages scored since the last call, in order; `wait`: block
    until every submitted stage is scored (an error if no scores come for
    `timeout_s`)."""
    out, t0 = [], time.monotonic()
    while self._waiting:
      try:
        msg = self._from.get(timeout=1.0 if wait else 0.0)
      except queue.Empty:
        if not self._proc.is_alive():
          raise RuntimeError(
              f'cascade: the evaluation process died (exit code '
              f'{self._proc.exitcode}) before scoring '
              f'{", ".join(self._waiting)}') from None
        if not wait:
          break
        if time.monotonic() - t0 > self.timeout_s:
          raise TimeoutError(
              f'cascade: no scores for {self._waiting[0]} from the '
              f'evaluation process in {self.timeout_s:.0f} s') from None
        continue
      if msg[0] == 'error':
        raise RuntimeError('cascade: the evaluation process failed while '
                           f'scoring {self._waiting[0]}:\n{msg[1]}')
      name, rec = msg[1], msg[2]
      if name != self._waiting[0]:
        raise RuntimeError(f'cascade: scores for {name}, expected '
                           f'{self._waiting[0]} first')
      self._waiting.pop(0)
      out.append((name, rec))
      t0 = time.monotonic()
    return out

  def close(self) -> None:
    """Stops the evaluation process (it scores no further stage)."""
    if self._proc is None:
      return
    utils.stop_process(self._proc, self._to, self._from)
    self._proc = None


def _worker_main(job: dict, inbox, outbox) -> None:
  """The evaluation process: a stage's directory in, its scores out."""
  try:
    os.nice(NICE)
    if job['cpus']:
      os.sched_setaffinity(0, set(job['cpus']))   # before XLA starts
    utils.apply_jax_settings(job['settings'])
    ops.configure(**job['ops']['choices'])
    ops.set_strict(job['ops']['strict'])
    config = ml_collections.ConfigDict(job['config'])
    parent = os.getppid()
    while True:
      try:
        msg = inbox.get(timeout=5.0)
      except queue.Empty:
        if os.getppid() != parent:    # the cascade was killed
          outbox.cancel_join_thread()
          return
        continue
      if msg[0] == 'stop':
        return
      _, name, run_dir = msg
      rec = scored(config, run_dir, job['evals'])
      outbox.put(('scored', name, rec))
  except BaseException:  # pylint: disable=broad-except
    outbox.put(('error', traceback.format_exc()))
    raise
