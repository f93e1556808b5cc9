"""`RLBatch`: the learner's one batch type, built here from single-turn rollouts or multi-turn episodes.

Every array is batch-major, a row per rollout: [B, T] token arrays (the
sequence, shifted: position t's input predicts target t), [B] per-rollout
values, and the routing the sampler used, [B, T, L_moe, k]. Row b of one
array is row b of every other, so a batch is sliced, filtered, trimmed and
concatenated the same way whatever it holds (`rows`, `concatenate`,
`trim_right`), and split over devices or micro-batches by its first axis.

    tokens   prompt (left-padded) + response, or a whole episode
    inputs   tokens[:-1]      targets  tokens[1:]
    mask     1 where the target is a token the model sampled (the loss)
    sampler_logp / kept   what the sampler drew each sampled token with

The collector fills the rollout's fields and `rewards`; the learner adds
`advantages` and the frozen models' log-probs (`ref_logp`, `teacher_logp`)
on the device before its update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from cascade_jax import model
from cascade_jax import rollout

_ROW_FIELDS = ('rewards', 'advantages')     # [B]; every other array is [B, T, ...]


@dataclasses.dataclass(frozen=True)
class RLBatch:
  """Rollouts as the learner scores them (see the module docstring).

  Host-side only (dropped when the batch goes through `jax.jit`):
  `domains`, each row's domain (MOPD asks that domain's teacher), and
  `learn`, False for a batch with nothing to learn from (every group was
  filtered): the learner then only checks that it scores what the sampler
  drew.
  """
  inputs: np.ndarray | jax.Array              # [B, T] int32
  targets: np.ndarray | jax.Array             # [B, T] int32
  positions: np.ndarray | jax.Array           # [B, T] int32
  segment_ids: np.ndarray | jax.Array         # [B, T] int32, 0: padding
  mask: np.ndarray | jax.Array                # [B, T] int32, 1: a sampled target
  sampler_logp: np.ndarray | jax.Array        # [B, T] float32, 0 off the mask
  rewards: np.ndarray | jax.Array             # [B] float32
  # [B, T] int32: the size of the top-k / top-p set each sampled token was
  # drawn from (the vocabulary elsewhere); None when the sampler kept none.
  kept: np.ndarray | jax.Array | None = None
  expert_idx: np.ndarray | jax.Array | None = None   # [B, T, L_moe, k]
  advantages: np.ndarray | jax.Array | None = None   # [B] float32
  ref_logp: np.ndarray | jax.Array | None = None     # [B, T] float32
  teacher_logp: np.ndarray | jax.Array | None = None  # [B, T] float32
  # [B, T] float32: the current policy's log-probs before the update (the
  # proximal policy of the decoupled objective; stale rollouts with more
  # than one update a batch).
  prox_logp: np.ndarray | jax.Array | None = None
  # A packed batch (`pack`): [R, W] int32, the rollout (row of `rewards`)
  # each position belongs to, the rollout count for padding. Its token
  # arrays then have R rows of several rollouts each, and `advantages`,
  # once computed, are per position [R, W].
  source_row: np.ndarray | jax.Array | None = None
  domains: tuple[str, ...] = ()
  learn: bool = True

  @property
  def num_rows(self) -> int:
    return self.mask.shape[0]

  def arrays(self) -> dict[str, np.ndarray | jax.Array]:
    """The arrays that are set, by field name."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name not in ('domains', 'learn')
            and getattr(self, f.name) is not None}

  def replace(self, **changes) -> 'RLBatch':
    return dataclasses.replace(self, **changes)

  @property
  def packed(self) -> bool:
    return self.source_row is not None

  def rows(self, index) -> 'RLBatch':
    """The rows `index` (a slice or integer array) of every array."""
    if self.packed:
      raise ValueError('rows of a packed batch: select before packing')
    doms = np.asarray(self.domains, object)[index] if self.domains else ()
    return self.replace(**{k: v[index] for k, v in self.arrays().items()},
                        domains=tuple(doms))

  def trim_right(self, bucket: int) -> 'RLBatch':
    """Drops trailing positions that no row's loss reaches, in whole buckets.

    Responses are usually far shorter than the generation budget; the
    learner's forward and backward passes (and the frozen models') then
    skip the empty tail. Whole buckets keep the shapes few (one compile
    each).
    """
    width = self.mask.shape[1]
    used = np.flatnonzero(np.asarray(self.mask).any(axis=0))
    need = int(used[-1]) + 1 if used.size else 1
    keep = width - (width - need) // bucket * bucket
    if keep == width:
      return self
    return self.replace(**{k: v if k in _ROW_FIELDS else v[:, :keep]
                           for k, v in self.arrays().items()})


jax.tree_util.register_dataclass(
    RLBatch, data_fields=[f.name for f in dataclasses.fields(RLBatch)
                          if f.name not in ('domains', 'learn')],
    meta_fields=[], drop_fields=['domains', 'learn'])


def concatenate(batches: Sequence[RLBatch]) -> RLBatch:
  """The rows of `batches` one after another (host arrays)."""
  first = batches[0]
  arrays = {k: np.concatenate([np.asarray(getattr(b, k)) for b in batches])
            for k in first.arrays()}
  return first.replace(**arrays, domains=tuple(
      d for b in batches for d in b.domains))


def pack(batch: RLBatch, width: int, rows_multiple: int = 1, *,
         min_rows: int = 0, headroom: float = 0.0) -> RLBatch:
  """The batch's rollouts packed into rows of `width` positions, several a row.

  A rollout's positions (its segment, `segment_ids` != 0: the prompt and
  what followed, contiguous) move whole into a row, first fit, longest
  first, each with a segment id of its own (attention, the Mamba state and
  positions restart there); the rows that are left are padding. Episode
  batches are mostly padding (rows of up to the episode budget for episodes
  a third that long, measured on the main job): packed, the learner's
  forward and backward run over the rollouts' tokens, not the budget. The
  row count is rounded up on a grid of quarter powers of two (one compile
  per size) and to `rows_multiple`, after `headroom` (0.25: room for a
  quarter more rows than this batch needs) and to at least `min_rows` (a
  stage's learner never lowers its row count: each new one compiles the
  update once more). A rollout longer than `width` widens the rows to the
  next multiple of `width`.

  Per-rollout values stay per rollout (`rewards` [B]); `source_row` maps
  every position back, so the learner computes the group advantages per
  rollout, then per position. Token-level losses only: the loss sums over
  positions, whatever row they are in.
  """
  if batch.packed:
    raise ValueError('pack: the batch is packed already')
  seg = np.asarray(batch.segment_ids) != 0
  b = seg.shape[0]
  first = np.where(seg.any(1), seg.argmax(1), 0)
  length = seg.sum(1)
  gaps = [i for i in range(b) if length[i] and
          not seg[i, first[i]:first[i] + length[i]].all()]
  if gaps:
    raise ValueError(f'pack: rollouts {gaps[:5]} are not contiguous (their '
                     'segments have holes); only whole sequences can be packed')
  longest = int(length.max(initial=1))
  width = -(-max(longest, 1) // width) * width
  order = np.argsort(-length, kind='stable')
  room: list[int] = []                      # free positions per packed row
  place = np.zeros((b, 2), np.int64)        # (row, offset) of each rollout
  for i in order:
    n = int(length[i])
    r = next((j for j, free in enumerate(room) if free >= n), len(room))
    if r == len(room):
      room.append(width)
    place[i] = r, width - room[r]
    room[r] -= n
  need = max(len(room), 1)
  rows = max(model.quarter_power_ceil(int(np.ceil(need * (1.0 + headroom)))),
             min_rows)
  rows = -(-rows // rows_multiple) * rows_multiple
  arrays = {k: np.asarray(v) for k, v in batch.arrays().items()
            if k not in _ROW_FIELDS}
  out = {}
  for k, v in arrays.items():
    fill = v.max(initial=1) if k == 'kept' else 0
    out[k] = np.full((rows, width, *v.shape[2:]), fill, v.dtype)
  source = np.full((rows, width), b, np.int32)
  next_id = np.ones(rows, np.int32)
  for i in range(b):
    n = int(length[i])
    if not n:
      continue
    r, o = place[i]
    src = slice(first[i], first[i] + n)
    for k in out:
      out[k][r, o:o + n] = arrays[k][i, src]
    out['segment_ids'][r, o:o + n] = next_id[r]
    next_id[r] += 1
    source[r, o:o + n] = i
  return batch.replace(**out, source_row=source)


def from_rollout(prompt_bp: np.ndarray, prompt_len_b: np.ndarray,
                 ro: rollout.Rollout, rewards: np.ndarray,
                 domains: Sequence[str] = ()) -> RLBatch:
  """The learner's view of single-turn rollouts, aligned with the sampler.

  The sequence is the left-padded prompt [B, P] followed by the response
  [B, N], so T = P + N - 1 (the last token is never an input). Targets on
  response positions are the sampled tokens, with the mask and the
  sampler's log-probs at the same places: `logp[mask]` of a forward pass
  over `inputs` is directly comparable to `sampler_logp[mask]`. The
  sampler's routing of prompt + response ([B, P + N, L, k]) loses its last
  position, never fed.
  """
  b, p = prompt_bp.shape
  toks = np.asarray(ro.tokens)
  n = toks.shape[1]
  mask_r = np.asarray(ro.mask)
  seq = np.concatenate([prompt_bp, toks], axis=1)            # [B, P + N]
  pos = np.arange(p + n)[None, :] - (p - prompt_len_b[:, None])
  valid = np.concatenate([pos[:, :p] >= 0, mask_r > 0], axis=1)
  mask = np.zeros((b, p + n - 1), np.int32)
  mask[:, p - 1:] = mask_r                                   # response targets
  lp = np.zeros((b, p + n - 1), np.float32)
  lp[:, p - 1:] = np.asarray(ro.logprobs)
  kept = None
  if ro.kept is not None:
    kept_r = np.asarray(ro.kept)
    kept = np.full((b, p + n - 1), kept_r.max(initial=1), np.int32)
    kept[:, p - 1:] = np.where(mask_r > 0, kept_r, kept.max(initial=1))
  return RLBatch(
      inputs=seq[:, :-1].astype(np.int32), targets=seq[:, 1:].astype(np.int32),
      positions=np.maximum(pos[:, :-1], 0).astype(np.int32),
      segment_ids=valid[:, :-1].astype(np.int32), mask=mask, sampler_logp=lp,
      rewards=np.asarray(rewards, np.float32), kept=kept,
      expert_idx=(None if ro.expert_idx is None else
                  np.asarray(ro.expert_idx)[:, :-1]),
      domains=tuple(domains))


def from_episodes(episodes: Sequence[rollout.Episode], width: int
                  ) -> RLBatch:
  """The learner's view of multi-turn episodes: each contiguous, right-padded to `width` inputs.

  An episode's tokens are its prompt, reply 1, observation 1, reply 2, ...;
  `mask` is 1 exactly where the target is a token the model sampled (the
  environment's tokens carry no loss and no advantage), with the sampler's
  log-probs and kept-set sizes there, and the experts every token was
  routed to. Its reward is the environment's.
  """
  b = len(episodes)
  z = lambda dt: np.zeros((b, width), dt)
  arr = dict(inputs=z(np.int32), targets=z(np.int32), positions=z(np.int32),
             segment_ids=z(np.int32), mask=z(np.int32),
             sampler_logp=z(np.float32), kept=np.ones((b, width), np.int32))
  experts = None
  if all(e.experts for e in episodes):
    l, k = episodes[0].experts[0].shape
    experts = np.zeros((b, width, l, k), np.int32)
  for i, e in enumerate(episodes):
    n = len(e.tokens) - 1
    if n > width:
      raise ValueError(f'episode of {n + 1} tokens does not fit a batch of '
                       f'width {width} (+1)')
    t = np.asarray(e.tokens, np.int32)
    arr['inputs'][i, :n] = t[:-1]
    arr['targets'][i, :n] = t[1:]
    arr['positions'][i, :n] = np.arange(n)
    arr['segment_ids'][i, :n] = 1
    arr['mask'][i, :n] = np.asarray(e.model[1:], np.int32)
    arr['sampler_logp'][i, :n] = np.asarray(e.logprobs[1:], np.float32)
    kept = np.asarray(e.kept[1:], np.int32)
    arr['kept'][i, :n] = np.where(kept > 0, kept, 1)
    if experts is not None:
      experts[i, :n] = np.stack(e.experts[:-1])
  vocab_max = arr['kept'].max(initial=1)
  arr['kept'] = np.where(arr['mask'] > 0, arr['kept'], vocab_max)
  return RLBatch(**arr, expert_idx=experts,
                 rewards=np.asarray([e.reward for e in episodes], np.float32),
                 domains=tuple(e.record['domain'] for e in episodes))
