"""Runs a cascade: each stage from its starting stage's checkpoint, every domain scored after each.

  <workdir>/config.json             the resolved cascade config
  <workdir>/<stage>/                the stage's own run directory
  <workdir>/<stage>/stage.json      written when the stage is done: kind,
                                    start, seconds, scores on every domain
  <workdir>/report/                 the report (see cascade_jax.report)

Started again after a kill, finished stages (stage.json present) are
skipped and the unfinished one resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import time

import ml_collections

from cascade_jax import domains
from cascade_jax import ops
from cascade_jax import reward_model
from cascade_jax import rl
from cascade_jax import sft
from cascade_jax import train
from cascade_jax import utils
from cascade_jax.cascade._plan import plan
from cascade_jax.cascade._plan import Stage
from cascade_jax.cascade import _scoring
from cascade_jax.cascade._scoring import score_stage


def stage_dir(workdir: str, name: str) -> str:
  return os.path.join(workdir, name)


PLACEMENT = ('mesh', 'rules', 'memory')
# The cascade's `episodes` limits and the RL config fields they fill.
EPISODE_LIMITS = dict(max_turns='max_turns',
                      max_observation_tokens='max_observation_tokens',
                      max_tokens='max_episode_tokens')


def runner_config(stage: Stage, workdir: str, seed: int,
                  cascade: ml_collections.ConfigDict | None = None
                  ) -> ml_collections.ConfigDict:
  """The stage's runner config: the cascade's seed and placement (mesh,
  rules, memory; a stage's own win), and stage names as run paths relative
  to the cascade's directory (`root`), so that a moved cascade resumes.
  An RL stage's unset episode limits take the cascade's `episodes`."""
  c = ml_collections.ConfigDict(stage.config.to_dict())
  c.seed = seed
  for key in PLACEMENT:
    if key not in c and cascade is not None and key in cascade:
      c[key] = ml_collections.ConfigDict(cascade[key].to_dict())
  c.root = os.path.abspath(workdir)
  if stage.init_from:
    c.init_from = stage.init_from
  if stage.kind in ('grpo', 'mopd'):
    limits = {} if cascade is None else cascade.get('episodes') or {}
    for key, rl_key in EPISODE_LIMITS.items():
      if limits.get(key) and not c.rl.get(rl_key):
        c.rl[rl_key] = int(limits[key])
    c.teachers = ml_collections.ConfigDict(dict(stage.teachers))
    c.reward_model = stage.reward_model or ''
    c.eval_n = 0          # the cascade scores every domain itself
  if stage.kind == 'sft':
    c.eval_n = 0
  return c


def eval_sets(config: ml_collections.ConfigDict) -> dict[str, list[dict]]:
  """The fixed eval split of every SFT domain: one per matrix column.

  `eval_n` prompts a domain; a multi-turn domain's first `eval_n_episodes`
  of them (0: `eval_n`), its episodes being the evaluation's costliest.
  """
  first_sft = next(s for s in plan(config) if s.kind == 'sft')
  c = ml_collections.ConfigDict(first_sft.config.to_dict())
  c.eval_n, c.seed = config.eval_n, config.seed
  n_episodes = config.get('eval_n_episodes', 0) or config.eval_n
  return {d: recs[:n_episodes] if domains.get(d).env is not None else recs
          for d, recs in sft.eval_sets(c).items()}


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
  """Runs (or resumes) the cascade; returns every stage's record.

  A stage is scored inline after its training or, with `eval_worker`
  'process' ('auto' on a single-process CPU run), in an evaluation process
  while the next stages train (`cascade_jax.cascade._scoring`); its record
  (`stage.json`) is written when its scores are in.
  """
  stages = plan(config)
  if config.get('ops'):
    ops.configure(**ops.parse(config.ops))
  if config.get('ops_strict'):
    ops.set_strict(True)
  os.makedirs(workdir, exist_ok=True)
  if train.is_main_process():
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2))
  # The run's CPU kernels (calibrated here first, if at all: the timing
  # must not share the CPU with an evaluation process), kept on resume and
  # passed to the processes it starts.
  ops.keep_run_kernels(workdir)
  evals = eval_sets(config)
  records = {}
  t_start = time.perf_counter()
  scoring = _scoring.make(config, evals)

  def finish(name: str, trained: dict, result: dict) -> None:
    rec = dict(trained, eval_s=result['eval_s'],
               eval=dict(temperature=config.eval_temperature,
                         samples=config.eval_samples),
               scores=result['scores'],
               ops=_merged(trained.pop('ops'), result['ops']),
               compiles=dict(train=trained.pop('train_compiles'),
                             eval=result['compiles']))
    rec['scored_in'] = trained.get('scored_in', 'inline')
    done = os.path.join(stage_dir(workdir, name), 'stage.json')
    if train.is_main_process():
      with open(done + '.tmp', 'w') as f:
        json.dump(rec, f, indent=2)
      os.replace(done + '.tmp', done)  # a stage is done only once this exists
    _barrier(f'cascade: {name} done')
    records[name] = rec
    n_comp = sum(x['compiles'] for x in rec['compiles'].values())
    print(f'[cascade] {name} done in {rec["train_s"]:.0f}s (+'
          f'{rec["eval_s"]:.0f}s eval'
          + (' beside the training' if rec['scored_in'] == 'process' else '')
          + f'; {n_comp} compiles, '
          f'{utils.compile_seconds(rec["compiles"]):.0f}s of it); '
          f'{time.perf_counter() - t_start:.0f}s so far', flush=True)

  trained_now = {}
  try:
    for i, st in enumerate(stages):
      d = stage_dir(workdir, st.name)
      head = (f'[cascade] stage {i + 1}/{len(stages)} {st.name} ({st.kind}'
              + (f' from {st.init_from}' if st.init_from else '')
              + (', branch' if st.branch else '') + ')')
      c = runner_config(st, workdir, config.seed, config)
      if os.path.exists(os.path.join(d, 'stage.json')):
        with open(os.path.join(d, 'stage.json')) as f:
          records[st.name] = json.load(f)
        print(f'{head}: done earlier, skipped')
        if _changed(c, d):
          print(f'[cascade] warning: {st.name} was run with another config '
                f'than the current one (see {d}/config.json); delete {d} to '
                'redo it')
        continue
      print(f'{head}: running', flush=True)
      t0 = time.perf_counter()
      extra = {}
      ops.reset_selected()
      with utils.CompileCounter() as train_compiles:
        if st.kind == 'sft':
          sft.run(c, d)
        elif st.kind == 'reward_model':
          extra = reward_model.train_run(c, d)
        elif st.kind == 'judge':
          extra = dict(judge=reward_model.judge_train_run(c, d))
        else:
          rl.run(c, d)
      trained = dict(name=st.name, kind=st.kind, init_from=st.init_from,
                     branch=st.branch, teachers=st.teachers,
                     reward_model=st.reward_model, domains=_domains(st),
                     train_s=time.perf_counter() - t0, ops=ops.selected(),
                     train_compiles=train_compiles.stats(), **extra)
      if st.kind in ('reward_model', 'judge'):    # scored by its own run
        finish(st.name, trained, _NOT_SCORED)
      else:
        if isinstance(scoring, _scoring.ProcessScoring):
          trained['scored_in'] = 'process'
          print(f'[cascade] {st.name} trained in {trained["train_s"]:.0f}s; '
                'scoring it in the evaluation process', flush=True)
        trained_now[st.name] = trained
        scoring.submit(st.name, d)
      for name, result in scoring.ready():
        finish(name, trained_now.pop(name), result)
    for name, result in scoring.ready(wait=True):
      finish(name, trained_now.pop(name), result)
  finally:
    scoring.close()
  return [records[st.name] for st in stages]


_NOT_SCORED = dict(scores={}, eval_s=0.0, ops={},
                   compiles=dict(compiles=0, compile_s=0.0, trace_s=0.0,
                                 cache_hits=0))


def _merged(a: dict[str, list[str]], b: dict[str, list[str]]
            ) -> dict[str, list[str]]:
  """Two `ops.selected()` tables as one."""
  return {op: sorted(set(a.get(op, ())) | set(b.get(op, ())))
          for op in sorted(set(a) | set(b))}


def rerun_stage(config: ml_collections.ConfigDict, run_dir: str, name: str,
                out_dir: str, *, init_from: str = '',
                stage_seed: int | None = None,
                extra: dict | None = None) -> list[dict]:
  """One RL stage of a finished cascade again, scored against its start.

  The stage (with `config`'s settings, e.g. changed hyperparameters) starts
  from `run_dir`'s checkpoint of `init_from` (default: the stage's own
  start), with the run's reward model and teachers, and writes to
  `out_dir`. Both ends are scored as the cascade scores a stage (every
  domain, same prompts and sampling keys: the start's scores are the run's
  own) and compared prompt by prompt.

  Returns per domain (the stage's own first): before, after, change, the
  paired standard error of the change, whether it is the stage's own and,
  where the domain names its checks, each check's share before and after
  (also written to `out_dir`/rerun.json, with the stage's seed and config,
  `meta`: the run's provenance and wall time, and `extra`'s fields).
  `stage_seed` (default: the cascade's seed) seeds the stage's training only
  (its prompt order and sampling), not the evaluation: reruns over seeds
  are scored on the same prompts with the same sampling keys.
  """
  meta, t0 = utils.provenance(), time.perf_counter()
  stages = {s.name: s for s in plan(config)}
  if name not in stages:
    raise ValueError(f'rerun_stage: no stage {name!r} in the cascade '
                     f'(stages: {sorted(stages)})')
  st = stages[name]
  if st.kind not in ('grpo', 'mopd'):
    raise ValueError(f'rerun_stage: {name} is a {st.kind} stage; only RL '
                     'stages (grpo, mopd) can be rerun')
  c = runner_config(st, run_dir, config.seed if stage_seed is None
                    else stage_seed, config)
  c.init_from = init_from or st.init_from
  start_dir = train.resolve(c.init_from, c.root)
  if not os.path.isdir(start_dir):
    raise FileNotFoundError(f'rerun_stage: no stage directory {start_dir}')
  rl.run(c, out_dir)
  own = _domains(st)
  evals = eval_sets(config)
  kw = dict(temperature=config.eval_temperature, samples=config.eval_samples,
            seed=config.seed, config=config)
  before = score_stage(start_dir, evals, **kw)
  after = score_stage(out_dir, evals, **kw)
  rows = []
  for d in sorted(evals, key=lambda d: (d not in own, d)):
    a, b = before[d], after[d]
    rows.append(dict(domain=d, own=d in own, before=a['pass_rate'],
                     after=b['pass_rate'],
                     change=b['pass_rate'] - a['pass_rate'],
                     se=domains.paired_se(list(a['prompt_pass'].items()),
                                          list(b['prompt_pass'].items()))))
    if b.get('by_check'):    # e.g. each IF constraint kind's share met
      rows[-1]['by_check'] = {
          k: dict(before=(a.get('by_check') or {}).get(k), after=v)
          for k, v in sorted(b['by_check'].items())}
  if train.is_main_process():
    with open(os.path.join(out_dir, 'rerun.json'), 'w') as f:
      json.dump(dict(stage=name, init_from=start_dir, seed=c.seed,
                     config=json.loads(c.to_json_best_effort()), rows=rows,
                     **dict(extra or {}),
                     meta=dict(meta, wall_s=time.perf_counter() - t0)),
                f, indent=2)
  return rows


def rerun_table(rows: list[dict], label: str = 'domain') -> str:
  """`rerun_stage`'s rows as a table (* marks the stage's own domains)."""
  return utils.format_table(
      [label, 'before', 'after', 'change', '2 SE (paired)', ''],
      [[r['domain'] + ('*' if r['own'] else ''), r['before'], r['after'],
        f"{r['change']:+.3f}", 2 * r['se'],
        'beyond' if abs(r['change']) > 2 * r['se'] else 'within']
       for r in rows])


def _changed(c: ml_collections.ConfigDict, run_dir: str) -> bool:
  want = json.loads(c.to_json_best_effort())
  want.pop('root', None)    # where the cascade is, not what the stage was
  try:
    with open(os.path.join(run_dir, 'config.json')) as f:
      return json.load(f) != want
  except (OSError, ValueError):
    return True


def _barrier(name: str) -> None:
  """All processes of a multi-host run wait here (a no-op on one)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def _domains(st: Stage) -> list[str]:
  if st.kind in ('grpo', 'mopd'):
    return [x.strip() for x in st.config.data.domain.split(',') if x.strip()]
  if st.kind in ('reward_model', 'judge'):
    return ['preference']
  return []
