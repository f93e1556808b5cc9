"""The cascade as data: an ordered list of stages, each its runner's full config plus three fields.

A cascade config (see configs/cascade.py) has

  order:   'sft,if_rl,multi_domain_rl,...'   the stages to run, in order
  stages:  name -> the stage runner's config (configs/sft.py, configs/rl.py
           configs/reward_model.py or configs/judge.py, with the stage's
           values) plus kind ('sft' | 'grpo' | 'mopd' | 'reward_model' |
           'judge'), init_from (a stage name) and branch.

In a stage, `teachers` (MOPD: domain -> stage) and `reward_model` name
stages, not directories; the runner resolves them. A stage starts from `init_from`
(an earlier stage's name), by default the latest earlier main-line stage;
`branch=True` keeps a stage off the main line (the paper's RLHF teacher is
RLHF from SFT), and a reward model is always off it. MOPD names its
teachers by domain -> stage; an RL stage may take its reward from a
reward-model stage (a Bradley-Terry model) or a judge stage (a generative
pairwise judge): `reward='bradley_terry' | 'generative_judge'` picks the
latest earlier stage of that kind, or `reward_model` names one. Every name
is checked before anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import ml_collections

KINDS = ('sft', 'grpo', 'mopd', 'reward_model', 'judge')
_META = ('kind', 'init_from', 'branch', 'reward')
# An RL stage's `reward` -> the kind of stage that gives it.
REWARDS = {'bradley_terry': 'reward_model', 'generative_judge': 'judge'}


@dataclasses.dataclass(frozen=True)
class Stage:
  name: str
  kind: str
  init_from: str            # an earlier stage's name ('' for the first SFT)
  branch: bool              # off the main line: later stages do not follow it
  teachers: dict[str, str]  # MOPD: domain -> stage
  reward_model: str         # a reward-model stage whose scores are the reward
  config: ml_collections.ConfigDict   # the runner's config, names unresolved


def _model_choice(config) -> dict | None:
  """The cascade-level `model` (a key of `models`): what every SFT stage
  trains (its preset, and overrides over the stage's own), and the stage
  settings measured for it (`stages`: stage -> settings over the stage's
  own); None: as the stages say. Later stages start from their
  `init_from`'s model."""
  name = config.get('model') or ''
  if not name:
    return None
  models = (config.get('models') or ml_collections.ConfigDict()).to_dict()
  if name not in models:
    raise ValueError(f'cascade: model {name!r} is not one of config.models '
                     f'{sorted(models)}')
  unknown = sorted(set(models[name].get('stages') or {}) - set(config.stages))
  if unknown:
    raise KeyError(f'cascade: config.models.{name}.stages names {unknown}, '
                   f'not stages of config.stages ({sorted(config.stages)})')
  return dict(models[name], name=name)


def _set_over(spec: dict, settings: dict, where: str) -> dict:
  """spec with `settings` (nested, as the stage's config) set over it; a
  key the stage does not have is an error naming its path."""
  out = dict(spec)
  for k, v in settings.items():
    if k not in out:
      raise KeyError(f'cascade: {where}.{k} is not a setting of the stage '
                     f'(it has {sorted(out)})')
    out[k] = (_set_over(out[k], v, f'{where}.{k}')
              if isinstance(v, dict) and isinstance(out[k], dict) else v)
  return out


def _is_run_path(init: str) -> bool:
  """An SFT stage's init_from that names no stage: 'hf:DIR' or a path."""
  return init.startswith('hf:') or '/' in init


def plan(config: ml_collections.ConfigDict) -> list[Stage]:
  """Checks the cascade and resolves every stage's starting point."""
  names = [n.strip() for n in config.order.split(',') if n.strip()]
  if not names:
    raise ValueError('cascade: config.order lists no stages')
  if len(set(names)) != len(names):
    raise ValueError(f'cascade: a stage is listed twice in order {names}')
  unknown = [n for n in names if n not in config.stages]
  if unknown:
    raise KeyError(f'cascade: order names stages {unknown} that '
                   f'config.stages does not define (defined: '
                   f'{sorted(config.stages)})')
  model = _model_choice(config)
  stages, main_line = [], ''
  for i, name in enumerate(names):
    spec = config.stages[name].to_dict()
    if model is not None and name in (model.get('stages') or {}):
      spec = _set_over(spec, model['stages'][name],
                       f"config.models.{model['name']}.stages.{name}")
    kind = spec.get('kind')
    if kind not in KINDS:
      raise ValueError(f'cascade stage {name!r}: kind {kind!r} is not one of '
                       f'{KINDS}')
    earlier = names[:i]
    init = spec.get('init_from') or main_line
    if kind == 'sft' and not spec.get('init_from'):
      init = ''
    elif kind == 'sft' and init not in earlier and _is_run_path(init):
      pass      # a run directory (an import) or 'hf:DIR'
    elif not init:
      raise ValueError(f'cascade stage {name!r} ({kind}) has nothing to start '
                       'from: put an SFT stage first or set init_from')
    elif init not in earlier:
      raise ValueError(f'cascade stage {name!r}: init_from {init!r} is not an '
                       f'earlier stage (earlier: {earlier})')
    teachers = {d: t for d, t in (spec.get('teachers') or {}).items() if t}
    for dom, t in teachers.items():
      if t not in earlier:
        raise ValueError(f'cascade stage {name!r}: teacher for {dom!r} is '
                         f'{t!r}, not an earlier stage (earlier: {earlier})')
    if kind == 'mopd' and not teachers:
      raise ValueError(f'cascade stage {name!r}: MOPD needs teachers '
                       '(domain -> stage)')
    rm = _reward_stage(config, name, spec, earlier)
    if kind in ('grpo', 'mopd'):
      data_spec = spec.get('data') or {}
      doms = [d.strip() for d in str(data_spec.get('domain', '')).split(',')
              if d.strip()]
      extra = sorted(set(data_spec.get('per_domain') or {}) - set(doms))
      if extra:
        raise ValueError(f'cascade stage {name!r}: data.per_domain names '
                         f'{extra}, not among its domains {doms}')
    branch = bool(spec.get('branch', False)) or kind in ('reward_model',
                                                         'judge')
    if kind in ('grpo', 'mopd') and spec['rl']['algorithm'] != kind:
      raise ValueError(f'cascade stage {name!r}: kind {kind!r} but '
                       f"rl.algorithm {spec['rl']['algorithm']!r}")
    cfg = ml_collections.ConfigDict(
        {k: v for k, v in spec.items() if k not in _META})
    if kind == 'sft' and model is not None:
      cfg.model.preset = model['preset']
      cfg.model.overrides.update(model.get('overrides') or {})
    stages.append(Stage(name, kind, init, branch, teachers, rm, cfg))
    if not branch:
      main_line = name
  return stages


def _reward_stage(config, name: str, spec: dict, earlier: Sequence[str]) -> str:
  """The stage whose scores are an RL stage's reward ('' for verifiers)."""
  reward = spec.get('reward') or ''
  rm = spec.get('reward_model') or ''
  if reward and reward not in REWARDS:
    raise ValueError(f'cascade stage {name!r}: reward {reward!r} is not one '
                     f'of {sorted(REWARDS)}')
  if reward and not rm:
    kind = REWARDS[reward]
    found = [n for n in earlier if config.stages[n].kind == kind]
    if not found:
      raise ValueError(f'cascade stage {name!r}: reward {reward!r} needs an '
                       f'earlier {kind} stage (earlier: {list(earlier)})')
    return found[-1]
  if not rm:
    return ''
  kinds = (REWARDS[reward],) if reward else tuple(REWARDS.values())
  if rm not in earlier or config.stages[rm].kind not in kinds:
    raise ValueError(f'cascade stage {name!r}: reward_model {rm!r} is not an '
                     f'earlier {" or ".join(kinds)} stage')
  return rm
