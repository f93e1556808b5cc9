"""One RL stage (GRPO or MOPD) from a previous run's checkpoint, with evaluation, checkpoints and resume.

The stage: start from `init_from` (a run directory: SFT or an earlier RL
stage); each step samples G rollouts for each of `prompts_per_step`
prompts of the stage's domain, scores them with the domain's verifier,
filters and advantages them, and takes one optimizer step. MOPD instead
asks each example's domain teacher (a frozen earlier run, by domain) for
per-token log-probs. The stage checkpoints its state and prompt position
and, run again after a kill, resumes where it stopped.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from cascade_jax import domains
from cascade_jax import losses
from cascade_jax import metrics as metrics_lib
from cascade_jax import reward_model
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.rl._learner import check_on_policy
from cascade_jax.rl._learner import collect
from cascade_jax.rl._learner import exact_moe
from cascade_jax.rl._learner import frozen_logprobs
from cascade_jax.rl._learner import PromptStream
from cascade_jax.rl._learner import RLConfig
from cascade_jax.rl._learner import update
from cascade_jax.rl._learner import verifier_rewards


def load_teachers(teachers: dict[str, str], setup: train.Setup | None = None
                  ) -> dict[str, tuple]:
  """Frozen teachers by domain, from run directories, on the stage's mesh;
  a missing one is an error."""
  out = {}
  for dom, run_path in teachers.items():
    run_dir = setup.path(run_path) if setup is not None else run_path
    if not run_dir or not os.path.isdir(os.path.join(run_dir, 'checkpoints')):
      raise FileNotFoundError(
          f'MOPD teacher for domain {dom!r}: no checkpoint at {run_dir!r}')
    _, m, _ = (setup.restore(run_path) if setup is not None else
               train.restore_run(run_dir))
    graph, params, rest = nnx.split(m, nnx.Param, ...)
    out[dom] = (graph, params, rest)
  return out


def _teacher_logp(teachers, batch, recs, *, temperature: float = 1.0,
                  put=None, rows_multiple: int = 1):
  """Each example scored by its own domain's teacher (no mixing), and no other.

  A teacher runs on its domain's rows alone, padded (with copies of its
  first row) to the next power of two (and to a multiple of the devices
  the batch is split over): a few shapes, one compile each, and no teacher
  scores another domain's rows. Returns (log-probs [B, T], the largest
  dropped fraction of any teacher's forward).
  """
  put = put or (lambda b: {k: jnp.asarray(v) for k, v in b.items()})
  doms = np.asarray([r['domain'] for r in recs])
  missing = sorted({str(d) for d in doms} - set(teachers))
  if missing:
    raise ValueError(f'MOPD: no teacher for domains {missing}; teachers: '
                     f'{sorted(teachers)}')
  out = np.zeros(batch['targets'].shape, np.float32)
  dropped = 0.0
  for dom, (graph, params, rest) in teachers.items():
    rows = np.flatnonzero(doms == dom)
    if not rows.size:
      continue
    size = max(1 << (rows.size - 1).bit_length(), rows_multiple)
    size = min(-(-size // rows_multiple) * rows_multiple, len(doms))
    take = np.concatenate([rows, np.full(size - rows.size, rows[0])])
    sub = {k: np.asarray(batch[k][take]) for k in _FORWARD_KEYS}
    moe = exact_moe(graph_config(graph, params, rest), sub)
    lp, dr = _frozen(graph, params, rest, put(sub), temperature=temperature,
                     moe=moe)
    out[rows] = sharding.to_host(lp)[:rows.size]
    dropped = max(dropped, float(sharding.to_host(dr)))
  return out, dropped


_FORWARD_KEYS = ('inputs', 'targets', 'positions', 'segment_ids')
_frozen = jax.jit(frozen_logprobs, static_argnames=('graph', 'temperature',
                                                    'moe'))


def graph_config(graph, params, rest):
  """The model config of a split model."""
  return nnx.merge(graph, params, rest).cfg


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) one RL stage; returns the final eval scores."""
  setup = train.Setup.create(config, workdir, name='rl')
  _, policy, tok = setup.restore(config.init_from, record=True)
  rc = RLConfig(**config.rl.to_dict())
  oc = train.OptimConfig(**config.optim.to_dict())
  opt = train.make_optimizer(oc)
  graph, state = setup.init_state(policy, opt)
  ref = None
  if rc.kl_coef:  # a frozen copy: the policy's own buffers are donated
    g, p, r = nnx.split(policy, nnx.Param, ...)
    ref = (g, jax.tree.map(jnp.copy, p), jax.tree.map(jnp.copy, r))
  teachers = load_teachers(dict(config.teachers), setup) if (
      rc.algorithm == 'mopd') else {}

  gen = dict(config.data.to_dict())
  doms = [d.strip() for d in gen.pop('domain').split(',') if d.strip()]
  n_train = gen.pop('n_train')
  # Generator options for every domain, then `per_domain.<name>`'s on top
  # (e.g. levels or kinds that only one of them has).
  per_domain = gen.pop('per_domain', {}) or {}
  unknown = sorted(set(per_domain) - set(doms))
  if unknown:
    raise ValueError(f'rl stage: data.per_domain names {unknown}, which are '
                     f'not among the stage\'s domains {doms}')
  opts = {d: {**gen, **per_domain.get(d, {})} for d in doms}
  # Several domains (comma-separated): prompts from each, one shuffled stream.
  stream = PromptStream([r for d in doms for r in domains.generate(
      d, split='train', n=n_train // len(doms), seed=config.seed, **opts[d])],
                        seed=config.seed)
  # eval_n = 0: no evaluation here (the cascade evaluates every domain).
  evals = {d: domains.generate(d, split='eval', n=config.eval_n,
                               seed=config.seed, **opts[d])
           for d in doms} if config.eval_n else {}
  reward_fn = reward_rm = None
  if config.get('reward_model'):
    path = setup.path(config.reward_model)
    reward_fn = reward_rm = reward_model.load(
        path, setup=setup, judge=config.get('judge'))
    what = ('the generative judge' if reward_model.is_judge(path) else
            'the reward model')
    print(f'[rl] rewards from {what} at {config.reward_model}')
  reward_fn = reward_fn or verifier_rewards
  # A stage with a multi-turn domain runs every record as an episode.
  episodes = None
  if any(domains.get(d).env is not None for d in doms):
    if reward_rm is not None:
      raise ValueError(f'rl stage: a reward model scores single replies; the '
                       f'multi-turn domains of {doms} are scored by their '
                       'environments')
    episodes = rc.episode_config(doms)
    print(f'[rl] multi-turn episodes: {episodes}')

  state, extra = setup.resume(state)
  start = 0 if extra is None else setup.ckpt.latest_step()  # RL steps
  # The learner's largest MoE capacity so far: each new one compiles the
  # update once; checkpointed, so that a resumed run computes with the
  # shapes (and so the float sums) of an uninterrupted one.
  capacity = 0
  if extra is not None:
    stream.position = int(extra['prompt_position'])
    capacity = int(extra.get('moe_capacity', 0))
    print(f'[rl] resumed from step {start}')
  # Rows past the checkpoint were written by the run that was killed: the
  # steps after it run again and write them anew.
  writer = setup.writer(keep=lambda row: _written_before(row, start,
                                                         config.steps))
  if start == 0:
    _evaluate(graph, state, tok, evals, writer, 0, config)
  progress = metrics_lib.Progress(config.steps, label=f'rl:{rc.algorithm}',
                                  start=start)
  rows_multiple = 1 if setup.ctx is None else setup.ctx.shards('batch')
  key0 = jax.random.key(config.seed)
  for step in range(start, config.steps):
    t0 = time.perf_counter()
    policy = nnx.merge(graph, state.params, state.rest)
    batch, rewards, recs, st = collect(policy, tok, stream, rc,
                                       jax.random.fold_in(key0, step),
                                       reward_fn=reward_fn,
                                       bounded_rewards=reward_rm is None,
                                       episodes=episodes)
    m = dict(reward_mean=float(np.mean(st['rewards'])),
             reward_std=float(np.std(st['rewards'])),
             pass_rate=float(np.mean(np.asarray(st['rewards']) >= 1.0)),
             filtered_groups=st['filtered_groups'],
             truncation_rate=st['truncated'] / max(len(st['rewards']), 1),
             sampled_prompts=st['sampled_prompts'],
             sample_s=st['sample_s'], score_s=st['score_s'])
    if reward_rm is not None:
      m['dropped_reward_model'] = reward_rm.last_dropped
    if st['turns']:
      m['episode_turns'] = float(np.mean(st['turns']))
      for end in rollout.ENDS:
        m[f'episode_end_{end}'] = float(np.mean(np.asarray(st['ends']) == end))
    if batch is not None:
      batch['advantages'] = np.asarray(losses.group_advantages(
          jnp.asarray(rewards), rc.rollouts_per_prompt,
          scale=rc.advantage_scale))
      if teachers:
        batch['teacher_logp'], m['dropped_teacher'] = _teacher_logp(
            teachers, batch, recs, temperature=rc.temperature, put=setup.put,
            rows_multiple=rows_multiple)
      if ref is not None:
        fwd = {k: batch[k] for k in _FORWARD_KEYS}
        lp, dr = _frozen(*ref, setup.put(fwd), temperature=rc.temperature,
                         moe=exact_moe(graph_config(*ref), fwd))
        batch['ref_logp'], m['dropped_reference'] = sharding.to_host(
            (lp, dr))
      t1 = time.perf_counter()
      state, um = update_minibatches(state, batch, graph=graph, opt=opt,
                                     cfg=rc, min_capacity=capacity,
                                     put=setup.put)
      capacity = max(capacity, int(um['moe_capacity']))
      m.update(um, train_s=time.perf_counter() - t1,
               response_length=float(batch['mask'].sum(1).mean()))
    else:  # every group was filtered: nothing to learn from this step
      probe = st['probe']
      m.update({k: float(v) for k, v in sharding.to_host(check_on_policy(
          state.params, state.rest, setup.put(probe),
          graph=graph, cfg=rc, moe=exact_moe(
              graph_config(graph, state.params, state.rest), probe))).items()})
    m['step_s'] = time.perf_counter() - t0
    writer.write(step + 1, m)
    dropped = {k: v for k, v in m.items() if k.startswith('dropped') and v}
    if dropped:   # exact dispatch drops nothing: a drop here is a bug, shown
      print(f'[rl] warning: step {step + 1}: scoring forwards dropped tokens '
            f'({dropped}): not on-policy', flush=True)
    if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
      progress.update(step + 1, {k: m[k] for k in ('reward_mean', 'pass_rate')
                                 if k in m})
    if config.eval_every and (step + 1) % config.eval_every == 0 and (
        step + 1 < config.steps):
      _evaluate(graph, state, tok, evals, writer, step + 1, config)
    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
      setup.save(step + 1, state, {'prompt_position': stream.position,
                                   'moe_capacity': capacity})
  setup.ckpt.wait()
  scores = _evaluate(graph, state, tok, evals, writer, config.steps, config)
  setup.write_json('rl_scores.json', {k: v.__dict__ for k, v in scores.items()})
  setup.close()
  writer.close()
  return scores


def update_minibatches(state, batch, *, graph, opt, cfg: RLConfig,
                       min_capacity: int = 0, put=None):
  """`updates_per_batch` optimizer steps, one per minibatch of whole groups.

  With one update (the recipe's default) this is strictly on-policy. With
  more, every minibatch after the first is scored by a policy that has moved
  since sampling: the sampler's log-probs are the old log-probs that the
  clipped ratio is taken against. The learner replays each minibatch's
  routing at a capacity that fits it, and at least `min_capacity` (pass the
  run's largest so far, metrics['moe_capacity']: the update then compiles
  again only when a batch needs more, a few times a stage).
  `put`: places a minibatch on the mesh (`train.Setup.put`).
  Returns (state, metrics): means over the minibatches; worst cases
  (`*_max`, dropped fractions, capacity) maxima.
  """
  put = put or (lambda b: jax.tree.map(jnp.asarray, b))
  n = cfg.updates_per_batch
  rows = batch['mask'].shape[0]
  if rows % n or (rows // n) % cfg.rollouts_per_prompt:
    raise ValueError(
        f'rl.updates_per_batch={n} must split the {rows} rollouts into equal '
        f'minibatches of whole groups of {cfg.rollouts_per_prompt}')
  if n > 1:
    batch = dict(batch, old_logp=batch['sampler_logp'])
  size, ms = rows // n, []
  model_cfg = graph_config(graph, state.params, state.rest)
  for i in range(n):
    sl = slice(i * size, (i + 1) * size)
    mb = {k: v[:, sl] if k == 'expert_idx' else v[sl] for k, v in batch.items()}
    moe = exact_moe(model_cfg, mb, min_capacity=min_capacity)
    state, um = update(state, put(mb), graph=graph, opt=opt, cfg=cfg, moe=moe)
    ms.append(dict(sharding.to_host(um),
                   moe_capacity=dict(moe).get('moe_capacity', 0)))
  # Worst cases are maxima over the minibatches, the rest means.
  worst = lambda k: (k.endswith('_max') or k.startswith('dropped') or
                     k == 'moe_capacity')
  return state, {k: float(np.max([m[k] for m in ms]) if worst(k) else
                          np.mean([m[k] for m in ms])) for k in ms[0]}


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
