"""One RL stage (GRPO or MOPD) from a previous run's checkpoint, with evaluation, checkpoints and resume.

The stage: start from `init_from` (a run directory: SFT or an earlier RL
stage); each step collects G rollouts for each of `prompts_per_step`
prompts of the stage's domains, scored by the domains' verifiers (or a
reward model, or the environments of multi-turn domains), filtered and
refilled (`collect`), and the learner takes one optimizer step on them
(`Learner.step`). MOPD instead asks each example's domain teacher (a frozen
earlier run, by domain) for per-token log-probs. The stage checkpoints its
state and prompt position and, run again after a kill, resumes where it
stopped.
"""

from __future__ import annotations

import time

import jax
import ml_collections
from flax import nnx

from cascade_jax import metrics as metrics_lib
from cascade_jax import model as model_lib
from cascade_jax import rollout
from cascade_jax import train
from cascade_jax.rl import _decoupled
from cascade_jax.rl import _process
from cascade_jax.rl._collect import PromptStream
from cascade_jax.rl._collect import step_metrics
from cascade_jax.rl._config import RLConfig
from cascade_jax.rl._learner import freeze
from cascade_jax.rl._learner import Learner
from cascade_jax.rl._learner import load_teachers
from cascade_jax.rl._sampler_side import collector
from cascade_jax.rl._sampler_side import Rewards
from cascade_jax.rl._sampler_side import sampler_side
from cascade_jax.rl._sampler_side import stage_data
from cascade_jax.rl._sampler_side import stage_rewards
from cascade_jax.rl._sampler_side import StageData
from cascade_jax.rl._sync import SamplerWeights


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) one RL stage; returns the final eval scores."""
  rc = RLConfig(**config.rl.to_dict())
  # `rl.rollout_devices`: the sampler's own devices, the learner's mesh
  # over the others.
  devices, sampler_devices = _decoupled.split_devices(rc.rollout_devices)
  setup = train.Setup.create(config, workdir, name='rl', devices=devices)
  _, policy, tok = setup.restore(config.init_from, record=True)
  opt = train.make_optimizer(train.OptimConfig(**config.optim.to_dict()))
  graph, state = setup.init_state(policy, opt)
  learner = _learner(config, setup, graph, policy, opt, rc,
                     split=bool(sampler_devices))
  data = stage_data(config)
  # A sampler process scores its own rollouts (and loads any reward model).
  rewards = (None if rc.rollout_worker == 'process' or sampler_devices else
             stage_rewards(config, setup, data.domains, rc))
  state, start, pending = _resume(setup, state, data.stream, learner)
  # Rows past the checkpoint were written by the run that was killed: the
  # steps after it run again and write them anew.
  writer = setup.writer(keep=lambda row: _written_before(row, start,
                                                         config.steps))
  if start == 0:
    _evaluate(graph, state, tok, data.evals, writer, 0, config)
  progress = metrics_lib.Progress(config.steps, label=f'rl:{rc.algorithm}',
                                  start=start)
  # On devices of its own the sampler's layout is made on its mesh (the
  # learner's side only casts).
  sampler = SamplerWeights(graph, rc.sampler_dtype, ctx=setup.ctx,
                           layout=('train' if sampler_devices else
                                   rc.sampler_layout),
                           weight_layout=rc.sampler_weight_layout)
  correction = learner.correction(state)
  if sampler.copies(state):
    print(f'[rl] the sampler runs a {rc.sampler_dtype} copy of the weights '
          f'in the {rc.sampler_layout} layout ({sampler.weight_layout} '
          f'weight layouts); the loss corrects for its dtype: {correction}')
  elif correction != 'none':
    print(f'[rl] the loss corrects for the sampler '
          f'({correction}): the model computes in '
          f'{learner.model_cfg(state).dtype} or rollouts may be stale')
  source = _rollouts(config, setup, rc, sampler, tok, data, rewards,
                     sampler_devices)
  source.start(start, state, pending, data.stream.position)
  ahead = rc.rollout_worker != 'inline'   # a sampler runs ahead of the steps
  try:
    for step in range(start, config.steps):
      t0 = time.perf_counter()
      ro = source.get(step)
      batch, stale = _decoupled.drop_stale(ro, step, rc.max_staleness)
      t1 = time.perf_counter()
      state, m = learner.step(state, batch)
      t2 = time.perf_counter()
      source.publish(step + 1, state)
      m = dict(step_metrics(ro.stats), **m, **ro.stats['reward_metrics'])
      if batch.learn:
        m['train_s'] = t2 - t1
      if sampler.copies(state) or ahead or sampler_devices:
        m['weight_sync_s'] = source.last_sync_s
      if rc.max_staleness or ahead:
        m.update(policy_staleness=step - ro.version, stale_dropped=stale,
                 rollout_wait_s=t1 - t0, sampler_wall_s=ro.wall_s)
      if rc.rollout_worker == 'process':   # a thread's XLA runs on a pool
        m['sampler_cpu_s'] = ro.cpu_s
      m['step_s'] = time.perf_counter() - t0
      _log(writer, progress, step + 1, m, config)
      if config.eval_every and (step + 1) % config.eval_every == 0 and (
          step + 1 < config.steps):
        _evaluate(graph, state, tok, data.evals, writer, step + 1, config)
      if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
        _save(setup, step + 1, state, source, learner, ro)
  finally:
    source.close()
  setup.ckpt.wait()
  scores = _evaluate(graph, state, tok, data.evals, writer, config.steps,
                     config)
  setup.write_json('rl_scores.json', {k: v.__dict__ for k, v in scores.items()})
  setup.close()
  writer.close()
  return scores


# ----------------------------------------------------------------- set-up


def _learner(config, setup: train.Setup, graph, policy, opt, rc: RLConfig,
             *, split: bool = False) -> Learner:
  """The stage's learner: a frozen copy of the start as the KL reference
  (when `kl_coef` > 0; a copy: the policy's buffers are donated), MOPD's
  teachers, the stage's mesh (`split`: the devices `rl.rollout_devices`
  left it), which must split a step's rollouts (checked now)."""
  multiple = 1 if setup.ctx is None else setup.ctx.shards('batch')
  # Before the frozen models load.
  Learner(graph, opt, rc, rows_multiple=multiple).check_rows(
      rc.prompts_per_step * rc.rollouts_per_prompt, where=(
          f' (the run\'s devices less rl.rollout_devices='
          f'{rc.rollout_devices})' if split else ''))
  reference = freeze(policy, copy=True) if rc.kl_coef else None
  teachers = (load_teachers(dict(config.teachers), setup)
              if rc.algorithm == 'mopd' else {})
  return Learner(graph, opt, rc, reference=reference, teachers=teachers,
                 put=setup.put, rows_multiple=multiple)


def _resume(setup, state, stream: PromptStream, learner: Learner):
  """(state, first step, queued rollouts): from the latest checkpoint, with
  the prompt position, the learner's MoE capacity and packed row count and
  the rollouts a decoupled run had sampled ahead, or a fresh start."""
  state, extra = setup.resume(state)
  if extra is None:
    return state, 0, []
  start = setup.ckpt.latest_step()  # RL steps
  stream.position = int(extra['prompt_position'])
  learner.capacity = int(extra.get('moe_capacity', 0))
  learner.pack_rows = int(extra.get('pack_rows', 0))
  pending = (_decoupled.load_pending(setup.workdir, extra['pending_rollouts'])
             if extra.get('pending_rollouts') else [])
  print(f'[rl] resumed from step {start}' + (
      f' with {len(pending)} step(s) of rollouts sampled ahead'
      if pending else ''))
  return state, start, pending


def _save(setup, step: int, state, source, learner: Learner,
          last: _decoupled.Rollout) -> None:
  """A checkpoint at `step`, with the prompt position after the rollouts
  already sampled (those of later steps saved beside it)."""
  pending = source.pending(step)
  extra = {'prompt_position': (pending[-1] if pending else last).position,
           'moe_capacity': learner.capacity, 'pack_rows': learner.pack_rows}
  if pending and train.is_main_process():
    extra['pending_rollouts'] = _decoupled.save_pending(setup.workdir, step,
                                                        pending)
  setup.save(step, state, extra)
  if train.is_main_process():
    _decoupled.prune_pending(setup.workdir,
                             set(setup.ckpt.all_steps()) | {step})


# ---------------------------------------------------------------- rollouts

def _rollouts(config, setup, rc: RLConfig, sampler: SamplerWeights, tok,
              data: StageData, rewards: Rewards, sampler_devices=None):
  """The stage's rollout source (`_decoupled`): inline, a sampler thread or
  a sampler process, the first two on the sampler's own devices where
  `sampler_devices`."""
  if rc.rollout_worker == 'process':
    cpus = rc.rollout_cpu_list()
    print(f'[rl] rollouts from a sampler process, at most '
          f'{rc.max_staleness} update(s) behind' +
          (f', on CPU cores {cpus}' if cpus else ''))
    return _process.ProcessRollouts(config, setup.workdir, sampler,
                                    rc.max_staleness, config.steps,
                                    cpus=cpus,
                                    coordinator=rc.rollout_coordinator,
                                    env=rc.rollout_env_vars())
  place = device = None
  if sampler_devices:
    device = sampler_devices[0]
    with jax.default_device(device):   # its reward model's placement
      collect_step, stream, model_of = sampler_side(config, setup.workdir,
                                                    sampler_devices)

    def place(model):
      _, params, rest = nnx.split(model, nnx.Param, ...)
      return jax.block_until_ready(model_of(jax.tree.leaves(
          model_lib.split_layers((params, rest)))))
    print(f'[rl] the sampler on devices of its own: '
          f'{[d.id for d in sampler_devices]} (rl.rollout_mesh '
          f"{rc.rollout_mesh or 'data=-1'}), the learner on the others")
  else:
    collect_step, stream = (collector(config, rc, tok, data, rewards),
                            data.stream)
  if rc.rollout_worker == 'inline':
    return _decoupled.InlineRollouts(collect_step, stream, sampler,
                                     rc.max_staleness, config.steps,
                                     place=place)
  print(f'[rl] rollouts from a sampler thread, at most {rc.max_staleness} '
        'update(s) behind')
  return _decoupled.ThreadRollouts(collect_step, stream, sampler,
                                   rc.max_staleness, config.steps,
                                   place=place, device=device)


# ---------------------------------------------------------------- outputs


def _log(writer, progress, step: int, m: dict, config) -> None:
  writer.write(step, m)
  dropped = {k: v for k, v in m.items() if k.startswith('dropped') and v}
  if dropped:   # exact dispatch drops nothing: a drop here is a bug, shown
    print(f'[rl] warning: step {step}: scoring forwards dropped tokens '
          f'({dropped}): not on-policy', flush=True)
  if step % config.log_every == 0 or step == config.steps:
    progress.update(step, {k: m[k] for k in ('reward_mean', 'pass_rate')
                           if k in m})


def _written_before(row: dict, start: int, steps: int) -> bool:
  """Whether a metrics row belongs to the run up to checkpoint `start`.

  Rows of later steps are written again when the run resumes, and so are
  evaluations at `start` itself when it is 0 (the first) or `steps` (the
  final one); a mid-run evaluation at `start` came before its checkpoint.
  """
  if row['step'] != start:
    return row['step'] < start
  return 0 < start < steps or not any(k.startswith('eval/') for k in row)


def _evaluate(graph, state, tok, evals, writer, step, config):
  return rollout.evaluate_and_log(
      nnx.merge(graph, state.params, state.rest), tok, evals, writer=writer,
      step=step, label='rl', temperature=config.get('eval_temperature', 0.0),
      samples=config.get('eval_samples', 1), seed=config.seed)
