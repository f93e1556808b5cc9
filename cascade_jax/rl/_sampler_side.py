"""What a stage's sampler side is made of, wherever it runs: its prompts and eval sets, its rewards, one step's collection, and (`sampler_side`) all of it built from the stage's config for a sampler of its own.

`rl.run` builds them for its inline sampler or sampler thread; a sampler
process (`_process`) builds the same from the same config, so both draw
the same rollouts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
from flax import nnx

from cascade_jax import domains
from cascade_jax import model as model_lib
from cascade_jax import reward_model
from cascade_jax import rollout
from cascade_jax import train
from cascade_jax.rl._collect import collect
from cascade_jax.rl._collect import PromptStream
from cascade_jax.rl._collect import verifier_rewards
from cascade_jax.rl._config import RLConfig
from cascade_jax.rl._shards import Shards
from cascade_jax.rl._sync import sampler_ctx
from cascade_jax.rl._sync import sampler_state


@dataclasses.dataclass
class StageData:
  domains: list[str]
  stream: PromptStream
  evals: dict[str, list[dict]]


def domain_options(data: dict, domain: str) -> dict:
  """`domains.generate`'s options for one of a stage's domains, from the
  stage's data config: its shared options, the row files for the domain
  that reads them, then `per_domain.<domain>` over them."""
  files = ('files', 'eval_files')
  out = {k: v for k, v in data.items()
         if k not in ('domain', 'n_train', 'per_domain') + files}
  if domain in domains.nemo_gym_rl.FILE_DOMAINS:
    out.update({k: data[k] for k in files if k in data})
  return {**out, **((data.get('per_domain') or {}).get(domain) or {})}


def stage_data(config, *, evals: bool = True) -> StageData:
  """The stage's prompt stream (its domains' train splits, one shuffled
  stream) and eval sets; `data.per_domain.<name>` options over the rest."""
  data = config.data.to_dict()
  doms = [d.strip() for d in data['domain'].split(',') if d.strip()]
  unknown = sorted(set(data.get('per_domain') or {}) - set(doms))
  if unknown:
    raise ValueError(f'rl stage: data.per_domain names {unknown}, which are '
                     f'not among the stage\'s domains {doms}')
  if ((data.get('files') or data.get('eval_files')) and
      not set(domains.nemo_gym_rl.FILE_DOMAINS) & set(doms)):
    raise ValueError(f"rl stage: data.files / data.eval_files are read by the "
                     f'NeMo-Gym domains {domains.nemo_gym_rl.FILE_DOMAINS}, '
                     f'none of which is among the stage\'s domains {doms}')
  n_train = data['n_train']
  opts = {d: domain_options(data, d) for d in doms}
  stream = PromptStream([r for d in doms for r in domains.generate(
      d, split='train', n=n_train // len(doms), seed=config.seed, **opts[d])],
                        seed=config.seed)
  # eval_n = 0: no evaluation here (the cascade evaluates every domain).
  evals = {d: domains.generate(d, split='eval', n=config.eval_n,
                               seed=config.seed, **opts[d])
           for d in doms} if config.eval_n and evals else {}
  return StageData(doms, stream, evals)


@dataclasses.dataclass
class Rewards:
  """Where a stage's rewards come from: a verifier, a reward model (or the
  generative judge), or the environments of multi-turn episodes."""
  fn: Callable
  bounded: bool = True
  episodes: rollout.EpisodeConfig | None = None
  model: object = None

  def metrics(self) -> dict[str, float]:
    return ({} if self.model is None else
            {'dropped_reward_model': self.model.last_dropped})


def stage_rewards(config, setup, doms, rc: RLConfig) -> Rewards:
  out = Rewards(functools.partial(verifier_rewards, passed=True)
                 if rc.verifier_reward == 'passed' else verifier_rewards)
  if config.get('reward_model'):
    path = setup.path(config.reward_model)
    out.model = out.fn = reward_model.load(path, setup=setup,
                                           judge=config.get('judge'))
    out.bounded = False
    what = ('the generative judge' if reward_model.is_judge(path) else
            'the reward model')
    print(f'[rl] rewards from {what} at {config.reward_model}')
  # A stage with a multi-turn domain runs every record as an episode.
  if any(domains.get(d).env is not None for d in doms):
    if out.model is not None:
      raise ValueError(f'rl stage: a reward model scores single replies; the '
                       f'multi-turn domains of {doms} are scored by their '
                       'environments')
    out.episodes = rc.episode_config(doms)
    print(f'[rl] multi-turn episodes: {out.episodes}')
  return out


# The mesh of the sampler's own devices (`rl.rollout_devices`) unless
# `rl.rollout_mesh` gives one.
SPLIT_MESH = {'data': -1}


def collector(config, rc: RLConfig, tok, data: StageData, rewards: Rewards):
  """(sampler model, step) -> (batch, stats): one step's collection, its
  key the stage seed's for that step."""
  key0 = jax.random.key(config.seed)

  def collect_step(model, step: int):
    batch, stats = collect(model, tok, data.stream, rc,
                           jax.random.fold_in(key0, step),
                           reward_fn=rewards.fn,
                           bounded_rewards=rewards.bounded,
                           host_rewards=rewards.model is None,
                           episodes=rewards.episodes)
    return batch, dict(stats, reward_metrics=rewards.metrics())
  return collect_step


def sampler_side(config, workdir: str, devices=None):
  """What a sampler worker builds from the stage's config, as the stage
  does: (collect (model, step), prompt stream, model of the weights the
  learner sends (`jax.tree.leaves((params, rest))` of the sampler's copy,
  one array a layer: `model.split_layers`; host arrays, a host's shards
  (`Shards`, a run of several processes) or arrays on other
  devices, each placed as the sampler's model holds it)).

  `devices`: the sampler's own (`rl.rollout_devices`), on a mesh of
  `rl.rollout_mesh`'s shape (default `SPLIT_MESH`); None: the process's
  (a sampler process), on `rl.rollout_mesh`'s shape or else the stage's
  mesh, as the stage's inline sampler has them (the same programs, so the
  same draws)."""
  rc = RLConfig(**config.rl.to_dict())
  ctx = (train.mesh_ctx(config, None, rc.rollout_mesh_shape())
         if devices is None else
         train.mesh_ctx(config, devices, rc.rollout_mesh_shape(SPLIT_MESH)))
  setup = train.Setup(config, workdir, 'rl-sampler', ctx,
                      train.memory_overrides(config), ckpt=None)
  setup.log_mesh()
  cfg, _, tok = train.model_shell(setup.path(config.init_from),
                                  memory=setup.memory)
  data = stage_data(config, evals=False)
  rewards = stage_rewards(config, setup, data.domains, rc)
  graph, params, rest = sampler_state(
      cfg, rc.sampler_dtype, sampler_ctx(cfg, ctx, rc.sampler_layout))
  tree = model_lib.split_layers((params, rest))   # one array a layer
  target, treedef = jax.tree.flatten(tree)
  places = [getattr(t, 'sharding', None) for t in target]
  if devices is not None and ctx is None:   # its one device
    places = [jax.sharding.SingleDeviceSharding(devices[0])] * len(target)

  def model_of(leaves):
    # `Shards`: this host's part of a weight that spans hosts.
    p, r = jax.tree.unflatten(treedef, [
        x.place(where) if isinstance(x, Shards) else
        jax.device_put(x, where)
        for x, where in zip(leaves, places, strict=True)])
    return nnx.merge(graph, p, r)
  return collector(config, rc, tok, data, rewards), data.stream, model_of
