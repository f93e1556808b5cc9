"""Rollouts for one RL step: sample, score, filter, refill, penalise the overlong; an `RLBatch` out.

The recipe's collection, strictly on-policy: every group in a step's batch
was sampled by the current policy. Groups whose rewards are all equal carry
no GRPO signal and are dropped (dynamic filtering), and more prompts are
sampled until the step has `prompts_per_step` groups or the refill rounds
run out. A response cut at the token budget is penalised, filtered out of
the loss or kept, as the stage says (`RLConfig.overlong`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from cascade_jax import data
from cascade_jax import domains
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax.rl import _batch
from cascade_jax.rl._config import RLConfig


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


def verifier_rewards(records, responses, sandbox=None, *,
                     passed: bool = False) -> np.ndarray:
  """Rewards from each record's domain verifier: its graded reward, or 1 /
  0 for a response that passes whole / does not (`passed`)."""
  scores = domains.score(records, responses, sandbox=sandbox)
  return np.asarray([float(s.passed) if passed else s.reward for s in scores],
                    np.float32)


def shared_rewards(reward_fn: RewardFn, records: Sequence[dict],
                   responses: Sequence[str], *, host: bool = True
                   ) -> np.ndarray:
  """Rewards [B] that every process of a run agrees on, decided once.

  On several processes each one holds every rollout, but a verdict can
  differ between hosts (a program near its time limit in the sandbox), and
  processes that filtered different groups would wait on each other's
  collectives for ever. `host` (a verifier, run row by row on the host):
  each process scores its own block of rows (the work is split, too) and
  the blocks are all-gathered. Otherwise (a reward model: a computation
  every process runs on the mesh) process 0's scores are everyone's.
  """
  if jax.process_count() == 1:
    return np.asarray(reward_fn(records, responses), np.float32)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  if not host:
    return np.asarray(multihost_utils.broadcast_one_to_all(
        np.asarray(reward_fn(records, responses), np.float32)))
  n, p = len(records), jax.process_count()
  block = -(-n // p)
  lo = min(jax.process_index() * block, n)
  hi = min(lo + block, n)
  mine = np.full(block, np.nan, np.float32)
  mine[:hi - lo] = (reward_fn(records[lo:hi], responses[lo:hi])
                    if hi > lo else [])
  return np.asarray(multihost_utils.process_allgather(mine)).reshape(-1)[:n]


def refill_size(missing: int, prompts_per_step: int) -> int:
  """Prompts to sample in a refill round for `missing` groups.

  The next power of two, at least a quarter of a step's prompts and at most
  all of them: a refill samples and scores little more than it needs. Single
  replies are sampled in the step's own shape (padded rows); episodes in at
  most three shapes besides it (each compiles once).
  """
  floor = max(prompts_per_step // 4, 1)
  return min(max(1 << (missing - 1).bit_length(), floor), prompts_per_step)


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


def collect(policy, tok: data.Tokenizer, stream: PromptStream, cfg: RLConfig,
            key: jax.Array, reward_fn: RewardFn = verifier_rewards, *,
            bounded_rewards: bool = True, host_rewards: bool = True,
            episodes: rollout.EpisodeConfig | None = None
            ) -> tuple[_batch.RLBatch, dict]:
  """One step's batch: `prompts_per_step` groups of G rollouts, after filtering and refills.

  Prompts are left-padded to `stream.prompt_width` (the stream's longest
  prompt), so every step has the same shapes and nothing recompiles. The
  first round samples `prompts_per_step` prompts; a refill round only what
  is still missing (`refill_size`). `bounded_rewards`: rewards are a
  verifier's (0 is the worst); False for a reward model's scores (see
  RLConfig.overlong). `host_rewards`: `reward_fn` runs on the host (a
  verifier); False for a reward model on the mesh (`shared_rewards`: on
  several processes, rewards are decided once either way). `episodes`: every record runs as a multi-turn episode
  (`rollout.run_episodes`; a single-turn domain's is one turn), its reward
  the environment's, its row the whole episode with the loss on the model's
  tokens only.

  Returns (batch, stats). When every group was filtered, the batch is the
  first group alone with `learn=False`: nothing to learn from, but the
  learner still checks it scores what the sampler drew. stats: groups,
  filtered_groups, kept_groups, sampled_prompts, rewards (as scored, before
  any overlong penalty), truncated, sample_s, score_s, turns, ends.
  """
  g = cfg.rollouts_per_prompt
  kept, probe = [], None
  stats = dict(groups=0, filtered_groups=0, truncated=0.0, sample_s=0.0,
               score_s=0.0, rewards=[], sampled_prompts=0, turns=[], ends=[],
               decode_steps=0, sampled_tokens=0)
  rounds = 1 + (cfg.max_refill_rounds if cfg.dynamic_filtering else 0)
  for round_ in range(rounds):
    missing = cfg.prompts_per_step - len(kept)
    if missing <= 0:
      break
    n_prompts = (cfg.prompts_per_step if round_ == 0 else
                 refill_size(missing, cfg.prompts_per_step))
    recs = [r for r in stream.take(n_prompts) for _ in range(g)]
    stats['sampled_prompts'] += n_prompts
    key, sub = jax.random.split(key)
    sample = _sample_replies if episodes is None else _sample_episodes
    rewards = (functools.partial(shared_rewards, reward_fn, host=host_rewards)
               if episodes is None else episodes)
    batch, trunc = sample(policy, tok, stream, recs, cfg, sub, rewards, stats)
    stats['rewards'].extend(batch.rewards.tolist())
    stats['truncated'] += float(trunc.sum())
    if cfg.overlong == 'penalty':
      batch = batch.replace(rewards=overlong_penalty(
          batch.rewards, trunc, g, bounded=bounded_rewards))
    if cfg.overlong == 'filter':
      batch = batch.replace(mask=batch.mask * (~trunc)[:, None])
    for j in range(len(recs) // g):
      group = batch.rows(slice(j * g, (j + 1) * g))
      stats['groups'] += 1
      if (cfg.dynamic_filtering and cfg.algorithm == 'grpo'
          and np.all(group.rewards == group.rewards[0])):
        stats['filtered_groups'] += 1
        if probe is None:
          probe = group
        continue
      kept.append(group)
  stats['kept_groups'] = min(len(kept), cfg.prompts_per_step)
  if not kept:
    return _assemble([probe], cfg).replace(learn=False), stats
  return _assemble(kept, cfg), stats


def _sample_replies(policy, tok, stream, recs, cfg: RLConfig, key, reward_fn,
                    stats) -> tuple[_batch.RLBatch, np.ndarray]:
  """One reply per record, scored: (batch, truncated [B])."""
  prompts = [data.encode_prompt(tok, r['messages']) for r in recs]
  t0 = time.perf_counter()
  # Exactly the stream's width: rounding a batch's longest prompt up to a
  # bucket could exceed it, and each such step compiled twice more.
  width = stream.prompt_width(tok)
  ptoks, plens = rollout.pad_prompts(prompts, 1, tok.pad_id, width=width)
  if cfg.sample_slots:   # continuous batching, a key a rollout
    ro = rollout.generate_continuous(
        policy, prompts,
        cfg=dataclasses.replace(cfg.sample_config, prompt_bucket=1),
        stop_ids=tok.stop_ids, slots=min(cfg.sample_slots, len(prompts)),
        pad_id=tok.pad_id, keys=jax.random.split(key, len(prompts)),
        record_experts=cfg.routing_replay, prompt_width=width,
        prefill_rows=cfg.prefill_rows)
  else:
    # A refill round's fewer rows sample in the first round's shape (its
    # rows' draws are unchanged): compiling a sampler per refill size cost
    # more than decoding the padding (1.3-1.9 s a compile in the main job,
    # against under 0.1 s for a whole round of single replies).
    ro = rollout.generate_padded(
        policy, ptoks, plens, cfg=cfg.sample_config, stop_ids=tok.stop_ids,
        pad_id=tok.pad_id, key=key, record_experts=cfg.routing_replay,
        min_rows=cfg.prompts_per_step * cfg.rollouts_per_prompt)
  ro = sharding.to_host(ro)          # the rollouts' one way out
  stats['sample_s'] += time.perf_counter() - t0
  t0 = time.perf_counter()
  texts = [tok.decode([t for t, m in zip(row, mk)
                       if m and t not in tok.stop_ids])
           for row, mk in zip(ro.tokens, ro.mask)]
  rewards = reward_fn(recs, texts)
  stats['score_s'] += time.perf_counter() - t0
  batch = _batch.from_rollout(ptoks, plens, ro, rewards,
                              [r['domain'] for r in recs])
  return batch, np.asarray(ro.truncated)


def _sample_episodes(policy, tok, stream, recs, cfg: RLConfig, key,
                     ec: rollout.EpisodeConfig, stats
                     ) -> tuple[_batch.RLBatch, np.ndarray]:
  """One episode per record, its reward the environment's: (batch, truncated [B])."""
  timing, decode = {}, {}
  t0 = time.perf_counter()
  slots = dict(slots=min(cfg.episode_slots, len(recs)),
               keys=jax.random.split(key, len(recs)),
               prefill_rows=cfg.prefill_rows) if cfg.episode_slots else {}
  eps = rollout.run_episodes(policy, tok, recs, cfg=ec,
                             sample=cfg.sample_config, key=key,
                             record_experts=cfg.routing_replay,
                             prompt_width=stream.prompt_width(tok),
                             timing=timing, stats=decode, **slots)
  env_s = timing.get('env_s', 0.0)
  stats['sample_s'] += time.perf_counter() - t0 - env_s
  stats['score_s'] += env_s
  stats['turns'] += [e.turns for e in eps]
  stats['ends'] += [e.end for e in eps]
  stats['decode_steps'] += decode['steps']
  stats['sampled_tokens'] += decode['row_steps']
  batch = _batch.from_episodes(eps, ec.max_tokens - 1)
  return _agreed(batch, np.asarray([e.truncated for e in eps]))


def _agreed(batch: _batch.RLBatch, truncated: np.ndarray
            ) -> tuple[_batch.RLBatch, np.ndarray]:
  """Process 0's episodes, on every process of a multi-process run.

  An episode's environment steps run on each host: a verdict or a tool's
  output that differs between hosts (a program near its time limit) changes
  the episode itself, not only its reward, and processes that filtered
  different groups would wait on each other's collectives for ever. So the
  episodes are decided once: process 0's tokens, masks, log-probs, rewards
  and truncation are everyone's (one broadcast of the host arrays).
  """
  if jax.process_count() == 1:
    return batch, truncated
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  arrays, truncated = multihost_utils.broadcast_one_to_all(
      (batch.arrays(), np.asarray(truncated, np.int32)))
  arrays = {k: np.asarray(v) for k, v in arrays.items()}
  return batch.replace(**arrays), np.asarray(truncated, bool)


def _assemble(groups: list[_batch.RLBatch], cfg: RLConfig) -> _batch.RLBatch:
  """`prompts_per_step` groups from the first ones, in one batch.

  A constant batch shape for the update: missing groups are copies with an
  empty mask and zero rewards (they add nothing to the loss).
  """
  kept = groups[:cfg.prompts_per_step]
  n = len(kept)
  while len(kept) < cfg.prompts_per_step:
    b = kept[len(kept) % n]
    kept.append(b.replace(mask=np.zeros_like(b.mask),
                          rewards=np.zeros_like(b.rewards)))
  out = _batch.concatenate(kept)
  return out.trim_right(cfg.trim_bucket) if cfg.trim_bucket else out


def step_metrics(stats: dict) -> dict[str, float]:
  """What a step's collection logs: rewards as scored, filtering, timing, episodes."""
  r = np.asarray(stats['rewards'], np.float64)
  m = dict(reward_mean=float(np.mean(r)), reward_std=float(np.std(r)),
           pass_rate=float(np.mean(r >= 1.0)),
           filtered_groups=stats['filtered_groups'],
           truncation_rate=stats['truncated'] / max(len(r), 1),
           sampled_prompts=stats['sampled_prompts'],
           sample_s=stats['sample_s'], score_s=stats['score_s'])
  if stats['turns']:
    m['episode_turns'] = float(np.mean(stats['turns']))
    for end in rollout.ENDS:
      m[f'episode_end_{end}'] = float(np.mean(np.asarray(stats['ends']) == end))
    # The sampler's decode steps, and the tokens each sampled on average
    # (continuous batching keeps more rows sampling a step).
    m['episode_decode_steps'] = stats['decode_steps']
    m['episode_tokens_per_step'] = (stats['sampled_tokens'] /
                                    max(stats['decode_steps'], 1))
  return m
