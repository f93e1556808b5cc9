"""The RL learner step: sample G rollouts per prompt, score, filter, advantages, one update.

GRPO as the recipe runs it: strictly on-policy (one optimizer update per
batch, so the importance ratio is exactly 1 and clipping never acts unless
`updates_per_batch` > 1), token-level normalisation, no KL unless
`kl_coef` > 0, dynamic filtering of groups whose rewards are all equal
(refilled from further prompts), and an overlong penalty or filter. MOPD
swaps the outcome advantage for the per-token teacher advantage.

The update is one jitted function of (state, batch); everything around it
(sampling, scoring, filtering) is plain Python below, top to bottom.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import losses
from cascade_jax import model as model_lib
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.rl._batch import training_batch


@dataclasses.dataclass(frozen=True)
class RLConfig:
  algorithm: str = 'grpo'           # 'grpo' | 'mopd'
  prompts_per_step: int = 16
  rollouts_per_prompt: int = 8
  temperature: float = 1.0
  # The learner scores a token under the distribution it was drawn from:
  # softmax(logits / temperature), renormalised over the top-k / top-p set.
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 48
  kl_coef: float = 0.0
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  updates_per_batch: int = 1
  advantage_scale: str = 'std'      # 'std' | 'none'
  dynamic_filtering: bool = True
  max_refill_rounds: int = 2
  # A response cut at max_new_tokens: 'penalty' (a verifier's reward 0; a
  # reward model's score replaced by the lowest of its group), 'filter'
  # (out of the loss: no gradient), or 'none' (scored as it is).
  overlong: str = 'penalty'
  routing_replay: bool = True
  mopd_reward_weight: float = 0.0
  # Cut the batch's empty response tail in buckets of this many tokens
  # (0: never). Each new width compiles the update once more: worth it for
  # long stages with a generous max_new_tokens, not for 30-step ones.
  trim_bucket: int = 0
  # Multi-turn domains (an environment per record; `max_new_tokens` is then
  # a reply's budget): turns, tokens of one observation, tokens of the
  # whole episode (prompt included; the learner's sequence length). 0: the
  # largest default of the stage's domains (`Domain.episode_limits`).
  max_turns: int = 0
  max_observation_tokens: int = 0
  max_episode_tokens: int = 0

  def episode_config(self, domain_names: Sequence[str]
                     ) -> rollout.EpisodeConfig:
    """Episode limits for a stage over `domain_names` (see max_turns)."""
    limits = [domains.get(d).episode_limits for d in domain_names]
    pick = lambda k, v: v or max(int(x.get(k, 1)) for x in limits)
    return rollout.EpisodeConfig(
        max_turns=pick('max_turns', self.max_turns),
        max_new_tokens=self.max_new_tokens,
        max_observation_tokens=pick('max_observation_tokens',
                                    self.max_observation_tokens),
        max_tokens=pick('max_tokens', self.max_episode_tokens))

  @property
  def sample_config(self) -> rollout.SampleConfig:
    return rollout.SampleConfig(max_new_tokens=self.max_new_tokens,
                                temperature=self.temperature,
                                top_p=self.top_p, top_k=self.top_k)

  def __post_init__(self):
    if self.algorithm not in ('grpo', 'mopd'):
      raise ValueError(f"rl.algorithm must be 'grpo' or 'mopd', got "
                       f'{self.algorithm!r}')
    if self.overlong not in ('penalty', 'filter', 'none'):
      raise ValueError(f'rl.overlong: {self.overlong!r} not in '
                       "('penalty', 'filter', 'none')")
    if not self.temperature > 0:
      raise ValueError(
          f'rl.temperature must be > 0, got {self.temperature}: the learner '
          'trains on sampled rollouts and scores them under softmax(logits / '
          'temperature); greedy decoding (0) is for evaluation only')
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f'rl.top_p must be in (0, 1], got {self.top_p}')
    if self.top_k < 0:
      raise ValueError(f'rl.top_k must be >= 0 (0: off), got {self.top_k}')
    if self.rollouts_per_prompt < 2 and self.algorithm == 'grpo':
      raise ValueError('rl.rollouts_per_prompt must be >= 2 for GRPO '
                       '(advantages compare rollouts of one prompt)')


def _forward_logp(params, rest, graph, batch, replay, sc: rollout.SampleConfig,
                  moe: tuple = (), entropy: bool = False):
  """Log-probs of the targets under the distribution the sampler drew from.

  softmax(processed logits): temperature, then top-k / top-p as the sampler
  applied them, so a token drawn from the kept set is scored renormalised
  over that set (the set of the size the sampler recorded, `batch['kept']`,
  else `rollout.process_logits` again). `moe`: (name, value) pairs of
  `model.exact_dispatch`, so that no token is dropped. The output head runs
  `logits_chunk` positions at a time (`train.token_stats`).

  Returns (logp [B, T], entropy [B, T] of the processed distribution or
  None, info).
  """
  model = nnx.merge(graph, params, rest)
  _, info = model(batch['inputs'], positions_bt=batch['positions'],
                  segment_ids_bt=batch['segment_ids'], expert_idx=replay,
                  return_logits=False, **dict(moe))
  aux = {}
  if rollout.truncates(sc) and 'kept' in batch:
    # The sampler's own kept-set sizes: the learner's logits differ from
    # the sampler's by rounding, which can move a top-p boundary.
    aux['kept'] = batch['kept']
    process = lambda lg, ax: rollout.keep_top_n(lg / sc.temperature, ax['kept'])
  else:
    process = lambda lg, ax: rollout.process_logits(lg, sc)
  logp, ent = train.token_stats(model.logits, info['hidden'], batch['targets'],
                                chunk=model.cfg.logits_chunk, process=process,
                                aux=aux, entropy=entropy)
  return logp, ent, info


def frozen_logprobs(graph, params, rest, batch, replay=None, *,
                    temperature: float = 1.0, moe: tuple = ()):
  """A frozen model's (reference or teacher) log-probs [B, T] at the
  student's sampling temperature, and its dropped fraction.

  Top-k / top-p are the student's sampling choice, not the frozen model's
  distribution: not applied (a teacher's log-prob of a token outside its
  own nucleus would be -inf).
  """
  logp, _, info = _forward_logp(
      params, rest, graph, batch, replay,
      rollout.SampleConfig(temperature=temperature), moe)
  return logp, model_lib.dropped_fraction(info)


def _moe_key(moe: dict) -> tuple:
  return tuple(sorted(moe.items()))


def exact_moe(model_cfg, batch, *, min_capacity: int = 0) -> tuple:
  """`update`'s / `frozen_logprobs`' static `moe` for a batch: no token dropped.

  `min_capacity`: the largest capacity a run has used (`model.exact_dispatch`).
  """
  replay = batch.get('expert_idx')
  return _moe_key(model_lib.exact_dispatch(
      model_cfg, None if replay is None else np.asarray(replay),
      np.asarray(batch['segment_ids']) != 0, min_capacity=min_capacity))


@functools.partial(jax.jit, static_argnames=('graph', 'opt', 'cfg', 'moe'),
                   donate_argnums=0)
def update(state: train.TrainState, batch, *, graph, opt, cfg: RLConfig,
           moe: tuple = ()):
  """One optimizer step on a rollout batch; returns (state, metrics).

  `moe`: from `exact_moe(model_cfg, batch)` (the default, (), keeps the
  model's configured dispatch, which may drop tokens under `capacity`).
  """
  replay = batch.get('expert_idx')

  def loss_fn(params):
    logp, ent, info = _forward_logp(params, state.rest, graph, batch,
                                    replay, cfg.sample_config, moe,
                                    entropy=True)
    if cfg.algorithm == 'grpo':
      loss, m = losses.grpo_loss(
          logp, batch['advantages'], batch['mask'],
          old_logp=batch.get('old_logp'), ref_logp=batch.get('ref_logp'),
          clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
          kl_coef=cfg.kl_coef)
    else:
      loss, m = losses.mopd_loss(
          logp, batch['teacher_logp'], batch['sampler_logp'], batch['mask'],
          reward_advantages=batch.get('advantages'),
          reward_weight=cfg.mopd_reward_weight)
    mask = batch['mask'].astype(jnp.float32)
    ent = jnp.sum(ent * mask) / jnp.maximum(mask.sum(), 1.0)
    return loss + info['aux_loss'], dict(
        m, entropy=ent, **_on_policy_metrics(logp, batch, info))

  (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = opt.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  m = dict(m, loss=loss, grad_norm=optax.global_norm(grads))
  return train.TrainState(params, state.rest, opt_state, state.step + 1), m


def _on_policy_metrics(logp, batch, info) -> dict[str, jax.Array]:
  """Learner vs sampler per response token (0 up to float rounding when the
  learner sees the sampler's weights, routing, temperature and kept set),
  and the learner forward's dropped-token fraction."""
  mask = batch['mask'].astype(jnp.float32)
  gap = jnp.abs(logp - batch['sampler_logp']) * mask
  return dict(sampler_mismatch_mean=jnp.sum(gap) / jnp.maximum(mask.sum(), 1.0),
              sampler_mismatch_max=jnp.max(gap),
              dropped_learner=model_lib.dropped_fraction(info))


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'moe'))
def check_on_policy(params, rest, batch, *, graph, cfg: RLConfig,
                    moe: tuple = ()):
  """`update`'s on-policy metrics without an update (a step with nothing to
  learn from still logs them)."""
  logp, _, info = _forward_logp(params, rest, graph, batch,
                                batch.get('expert_idx'), cfg.sample_config, moe)
  return _on_policy_metrics(logp, batch, info)


@dataclasses.dataclass
class PromptStream:
  """Prompts in a seeded order (a new permutation each epoch), resumable from `position`."""
  records: Sequence[dict]
  seed: int = 0
  position: int = 0
  _width: int | None = dataclasses.field(default=None, repr=False)
  _order: tuple[int, np.ndarray] | None = dataclasses.field(default=None,
                                                           repr=False)

  def prompt_width(self, tok: data.Tokenizer) -> int:
    """Tokens in the longest prompt of the stream (computed once)."""
    if self._width is None:
      self._width = max(len(data.encode_prompt(tok, r['messages']))
                        for r in self.records)
    return self._width

  def take(self, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      epoch, i = divmod(self.position, len(self.records))
      if self._order is None or self._order[0] != epoch:  # once per epoch
        self._order = (epoch, np.random.RandomState(self.seed + epoch)
                       .permutation(len(self.records)))
      out.append(self.records[self._order[1][i]])
      self.position += 1
    return out


RewardFn = Callable[[Sequence[dict], Sequence[str]], np.ndarray]


def verifier_rewards(records, responses, sandbox=None) -> np.ndarray:
  """Rewards from each record's domain verifier."""
  return np.asarray([s.reward for s in domains.score(records, responses,
                                                     sandbox=sandbox)],
                    np.float32)


def refill_size(missing: int, prompts_per_step: int) -> int:
  """Prompts to sample in a refill round for `missing` groups.

  The next power of two, at least a quarter of a step's prompts and at most
  all of them: a refill samples little more than it needs, in at most three
  sampler shapes besides the step's own (each compiles once).
  """
  floor = max(prompts_per_step // 4, 1)
  return min(max(1 << (missing - 1).bit_length(), floor), prompts_per_step)


def collect(policy, tok: data.Tokenizer, stream: PromptStream, cfg: RLConfig,
            key: jax.Array, reward_fn: RewardFn = verifier_rewards, *,
            bounded_rewards: bool = True,
            episodes: rollout.EpisodeConfig | None = None):
  """Rollouts for one step, after dynamic filtering and refills.

  Prompts are left-padded to `stream.prompt_width` (the stream's longest
  prompt), so every step has the same shapes and nothing recompiles. The
  first round samples `prompts_per_step` prompts; a refill round only what
  is still missing (`refill_size`), and every kept group is sampled by the
  current policy (strictly on-policy: no group is kept for a later step).
  `bounded_rewards`: rewards are a verifier's (0 is the worst); False for a
  reward model's scores (see RLConfig.overlong).
  `episodes`: every record runs as a multi-turn episode
  (`rollout.run_episodes`; a single-turn domain's is one turn), its reward
  the environment's, its batch row the whole episode with the loss on the
  model's tokens only.

  Returns (batch dict of numpy arrays, rewards [B], records [B], stats).
  """
  g = cfg.rollouts_per_prompt
  kept, stats = [], dict(groups=0, filtered_groups=0, truncated=0.0,
                         sample_s=0.0, score_s=0.0, rewards=[],
                         sampled_prompts=0, turns=[], ends=[])
  for round_ in range(1 + (cfg.max_refill_rounds if cfg.dynamic_filtering
                           else 0)):
    missing = cfg.prompts_per_step - len(kept)
    if missing <= 0:
      break
    n_prompts = (cfg.prompts_per_step if round_ == 0 else
                 refill_size(missing, cfg.prompts_per_step))
    recs = [r for r in stream.take(n_prompts) for _ in range(g)]
    stats['sampled_prompts'] += n_prompts
    key, sub = jax.random.split(key)
    if episodes is None:
      batch, rewards, trunc = _sample_replies(policy, tok, stream, recs, cfg,
                                              sub, reward_fn, stats)
    else:
      batch, rewards, trunc = _sample_episodes(policy, tok, stream, recs, cfg,
                                               sub, episodes, stats)
    stats['rewards'].extend(rewards.tolist())
    stats['truncated'] += float(trunc.sum())
    if cfg.overlong == 'penalty':
      rewards = overlong_penalty(rewards, trunc, g, bounded=bounded_rewards)
    if cfg.overlong == 'filter':
      batch['mask'] = batch['mask'] * (~trunc)[:, None]
    for j in range(len(recs) // g):
      sl = slice(j * g, (j + 1) * g)
      stats['groups'] += 1
      group = ({k: v[:, sl] if k == 'expert_idx' else v[sl]
                for k, v in batch.items()}, rewards[sl], recs[sl])
      if (cfg.dynamic_filtering and cfg.algorithm == 'grpo'
          and np.all(rewards[sl] == rewards[sl][0])):
        stats['filtered_groups'] += 1
        if not kept and 'probe' not in stats:
          stats['probe'] = group
        continue
      kept.append(group)
  if not kept:
    # Nothing to learn from; the first filtered group, as an update batch,
    # still shows whether the learner scores what the sampler drew.
    stats['probe'] = _assemble([stats['probe']], cfg)[0]
    return None, None, None, stats
  stats.pop('probe', None)
  stats['kept_groups'] = min(len(kept), cfg.prompts_per_step)
  return _assemble(kept, cfg) + (stats,)


def _sample_replies(policy, tok, stream, recs, cfg: RLConfig, key, reward_fn,
                    stats):
  """One reply per record, scored: (batch, rewards, truncated)."""
  prompts = [data.encode_prompt(tok, r['messages']) for r in recs]
  t0 = time.perf_counter()
  # Exactly the stream's width: rounding a batch's longest prompt up to a
  # bucket could exceed it, and each such step compiled twice more.
  ptoks, plens = rollout.pad_prompts(prompts, 1, tok.pad_id,
                                     width=stream.prompt_width(tok))
  ro = rollout.generate_padded(policy, ptoks, plens, cfg=cfg.sample_config,
                               stop_id=tok.im_end, pad_id=tok.pad_id,
                               key=key, record_experts=cfg.routing_replay)
  ro = sharding.to_host(ro)
  stats['sample_s'] += time.perf_counter() - t0
  t0 = time.perf_counter()
  texts = [tok.decode([t for t, m in zip(row, mk) if m and t != tok.im_end])
           for row, mk in zip(ro.tokens, ro.mask)]
  rewards = np.asarray(reward_fn(recs, texts), np.float32)
  stats['score_s'] += time.perf_counter() - t0
  batch = training_batch(ptoks, plens, ro)
  if ro.expert_idx is not None:
    batch['expert_idx'] = np.asarray(ro.expert_idx)[:, :, :-1]
  return batch, rewards, np.asarray(ro.truncated)


def _sample_episodes(policy, tok, stream, recs, cfg: RLConfig, key,
                     ec: rollout.EpisodeConfig, stats):
  """One episode per record: (batch, rewards, truncated)."""
  timing = {}
  t0 = time.perf_counter()
  eps = rollout.run_episodes(policy, tok, recs, cfg=ec,
                             sample=cfg.sample_config, key=key,
                             record_experts=cfg.routing_replay,
                             prompt_width=stream.prompt_width(tok),
                             timing=timing)
  env_s = timing.get('env_s', 0.0)
  stats['sample_s'] += time.perf_counter() - t0 - env_s
  stats['score_s'] += env_s
  stats['turns'] += [e.turns for e in eps]
  stats['ends'] += [e.end for e in eps]
  batch = rollout.episode_batch(eps, ec.max_tokens - 1)
  rewards = np.asarray([e.reward for e in eps], np.float32)
  return batch, rewards, np.asarray([e.truncated for e in eps])


def _assemble(groups, cfg: RLConfig):
  """(batch, rewards, records) of `prompts_per_step` groups from the first ones.

  A constant batch shape for the update: missing groups are copies with an
  empty mask (they add nothing to the loss).
  """
  kept = groups[:cfg.prompts_per_step]
  n = len(kept)
  while len(kept) < cfg.prompts_per_step:
    b, r, rc = kept[len(kept) % n]
    kept.append((dict(b, mask=np.zeros_like(b['mask'])), np.zeros_like(r),
                 rc))
  out = {k: np.concatenate([b[k] for b, _, _ in kept],
                           axis=1 if k == 'expert_idx' else 0)
         for k in kept[0][0]}
  if cfg.trim_bucket:
    out = trim_right(out, cfg.trim_bucket)
  return out, np.concatenate([k[1] for k in kept]), [r for k in kept
                                                      for r in k[2]]


def overlong_penalty(rewards, truncated, group_size: int, *,
                     bounded: bool = True) -> np.ndarray:
  """A cut response's reward: 0 for a verifier's rewards, else its group's lowest.

  A reward model's scale has no "worst" value (0 may be a good score), so
  there a cut response ranks last in its group instead.
  """
  rewards = np.asarray(rewards, np.float32)
  if bounded:
    return np.where(truncated, 0.0, rewards).astype(np.float32)
  low = rewards.reshape(-1, group_size).min(axis=1).repeat(group_size)
  return np.where(truncated, low, rewards).astype(np.float32)


def trim_right(batch: dict, bucket: int = 16) -> dict:
  """Drops trailing columns that no response reaches, in whole buckets.

  Responses are usually far shorter than the generation budget; the
  learner's forward and backward passes (and the teachers') then skip the
  empty tail. Whole buckets keep the shapes few (one compile each). [B, T]
  arrays and expert_idx [L, B, T, k] are cut; per-row arrays are kept.
  """
  width = batch['mask'].shape[1]
  used = np.flatnonzero(batch['mask'].any(axis=0))
  need = int(used[-1]) + 1 if used.size else 1
  keep = width - (width - need) // bucket * bucket
  if keep == width:
    return batch
  return {k: v[:, :, :keep] if k == 'expert_idx' else
          (v[:, :keep] if v.ndim == 2 else v) for k, v in batch.items()}
