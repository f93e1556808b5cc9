"""The RL learner: `Learner.step(state, batch) -> (state, metrics)`, from a collected batch to the next train state.

GRPO as the recipe runs it: strictly on-policy (one optimizer update per
batch, so the importance ratio is exactly 1 and clipping never acts unless
`updates_per_batch` > 1), token-level normalisation, no KL unless
`kl_coef` > 0. MOPD swaps the outcome advantage for the per-token teacher
advantage, each row scored by its own domain's teacher.

A step puts the batch on the devices once; the advantages, the reference's
and teachers' log-probs and the update (its gradient accumulated over
`micro_batches`) are computed there, and the step's metrics come back in
one transfer. The learner scores each sampled token under the
distribution it was drawn from, with the sampler's routing replayed at a
capacity that drops nothing: `sampler_mismatch_max` is float rounding.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cascade_jax import losses
from cascade_jax import model as model_lib
from cascade_jax import rollout
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.rl import _batch
from cascade_jax.rl._batch import RLBatch
from cascade_jax.rl._config import RLConfig

_FORWARD = ('inputs', 'targets', 'positions', 'segment_ids')


class Frozen(NamedTuple):
  """A model that is scored, not trained (the KL reference, a MOPD teacher)."""
  graph: nnx.GraphDef
  params: nnx.State
  rest: nnx.State

  @property
  def cfg(self) -> model_lib.ModelConfig:
    return nnx.merge(self.graph, self.params, self.rest).cfg


def freeze(model: nnx.Module, *, copy: bool = False) -> Frozen:
  """`model` as a Frozen; `copy`: its own buffers (the policy's are donated)."""
  graph, params, rest = nnx.split(model, nnx.Param, ...)
  if copy:
    params, rest = jax.tree.map(jnp.copy, (params, rest))
  return Frozen(graph, params, rest)


def load_teachers(teachers: Mapping[str, str], setup: train.Setup | None = None
                  ) -> dict[str, Frozen]:
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
    out[dom] = freeze(m)
  return out


# ---------------------------------------------------------------- forwards


def _forward_logp(params, rest, graph, fwd: Mapping[str, jax.Array], replay,
                  sc: rollout.SampleConfig, moe: tuple = (),
                  entropy: bool = False):
  """Log-probs of the targets under the distribution the sampler drew from.

  softmax(processed logits): temperature, then top-k / top-p as the sampler
  applied them, so a token drawn from the kept set is scored renormalised
  over that set (the set of the size the sampler recorded, `fwd['kept']`,
  else `rollout.process_logits` again). `replay` [B, T, L_moe, k]: the
  sampler's routing. `moe`: (name, value) pairs of `model.exact_dispatch`,
  so that no token is dropped. The output head runs `logits_chunk`
  positions at a time (`train.token_stats`).

  Returns (logp [B, T], entropy [B, T] of the processed distribution or
  None, info).
  """
  model = nnx.merge(graph, params, rest)
  _, info = model(fwd['inputs'], positions_bt=fwd['positions'],
                  segment_ids_bt=fwd['segment_ids'], expert_idx=replay,
                  return_logits=False, **dict(moe))
  aux = {}
  if rollout.truncates(sc) and fwd.get('kept') is not None:
    # The sampler's own kept-set sizes: the learner's logits differ from
    # the sampler's by rounding, which can move a top-p boundary.
    aux['kept'] = fwd['kept']
    process = lambda lg, ax: rollout.keep_top_n(lg / sc.temperature, ax['kept'])
  else:
    process = lambda lg, ax: rollout.process_logits(lg, sc)
  logp, ent = train.token_stats(model.logits, info['hidden'], fwd['targets'],
                                chunk=model.cfg.logits_chunk, process=process,
                                aux=aux, entropy=entropy)
  return logp, ent, info


@functools.partial(jax.jit, static_argnames=('graph', 'temperature', 'moe'))
def frozen_logprobs(graph, params, rest, fwd, *, temperature: float = 1.0,
                    moe: tuple = ()):
  """A frozen model's (reference or teacher) log-probs [B, T] at the
  student's sampling temperature, and its dropped fraction.

  `fwd`: inputs, targets, positions, segment_ids [B, T]. The frozen model
  routes with its own router. Top-k / top-p are the student's sampling
  choice, not the frozen model's distribution: not applied (a teacher's
  log-prob of a token outside its own nucleus would be -inf).
  """
  logp, _, info = _forward_logp(
      params, rest, graph, fwd, None,
      rollout.SampleConfig(temperature=temperature), moe)
  return logp, model_lib.dropped_fraction(info)


def _moe_key(moe: dict) -> tuple:
  return tuple(sorted(moe.items()))


def exact_moe(model_cfg, batch: RLBatch | None = None, *, min_capacity: int = 0,
              parts: list[np.ndarray] | None = None,
              headroom: float = 0.0) -> tuple:
  """`update`'s / `frozen_logprobs`' static `moe` for a host batch: no token dropped.

  With the batch's routing replayed, a capacity that fits the largest of
  `parts` (row index arrays: the micro-batches the update runs; default
  the whole batch) with `headroom` to spare and at least `min_capacity`
  (the largest a run has used: `model.exact_dispatch`); without routing, a
  dropless path.
  """
  replay = None if batch is None else batch.expert_idx
  if replay is None:
    return _moe_key(model_lib.exact_dispatch(model_cfg))
  replay, valid = np.asarray(replay), np.asarray(batch.segment_ids) != 0
  caps = [dict(model_lib.exact_dispatch(
      model_cfg, replay if rows is None else replay[rows],
      valid if rows is None else valid[rows], min_capacity=min_capacity,
      headroom=headroom))
          for rows in (parts or [None])]
  return _moe_key(max(caps, key=lambda c: c.get('moe_capacity', 0)))


# ------------------------------------------------------------------ update


def _on_policy_metrics(logp, batch, info, n_tokens) -> dict[str, jax.Array]:
  """Learner vs sampler per response token (0 up to float rounding when the
  learner sees the sampler's weights, routing, temperature and kept set),
  and the learner forward's dropped- and spilled-token fractions."""
  gap = jnp.abs(logp - batch.sampler_logp) * batch.mask.astype(jnp.float32)
  return dict(sampler_mismatch_mean=jnp.sum(gap) / n_tokens,
              sampler_mismatch_max=jnp.max(gap),
              dropped_learner=model_lib.dropped_fraction(info),
              spilled_learner=model_lib.spilled_fraction(info))


def _fwd(batch: RLBatch) -> dict[str, jax.Array]:
  return dict({k: getattr(batch, k) for k in _FORWARD}, kept=batch.kept)


def _loss(logp, batch: RLBatch, cfg: RLConfig, off_policy: bool, counts,
          correction: str = 'none'):
  """The stage's loss. `correction` ('tis', 'mask' or 'none'): how GRPO
  weighs a token sampled by a sampler that is not the learner (a narrower
  dtype, or a stale policy). With several updates a batch the ratio is
  taken against the sampler's log-probs, or, for stale rollouts, against
  the proximal policy's (`batch.prox_logp`, the decoupled objective), the
  sampler's then weighed as the behaviour policy's."""
  if cfg.algorithm == 'grpo':
    # The clipped ratio's old policy: the proximal one where computed
    # (stale rollouts, several updates), else the sampler's with several
    # updates, else none (ratio 1). The behaviour weight: the sampler's
    # log-probs against that old policy (or the current one).
    prox = batch.prox_logp
    old = prox if prox is not None else (
        batch.sampler_logp if off_policy else None)
    weigh = correction != 'none' and (prox is not None or not off_policy)
    behaviour = dict(sampler_logp=batch.sampler_logp, tis_cap=cfg.tis_cap,
                     sampler_mask=correction == 'mask') if weigh else {}
    return losses.grpo_loss(
        logp, batch.advantages, batch.mask, old_logp=old,
        ref_logp=batch.ref_logp, clip_eps_low=cfg.clip_eps_low,
        clip_eps_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef, **behaviour,
        **counts)
  return losses.mopd_loss(
      logp, batch.teacher_logp, batch.sampler_logp, batch.mask,
      reward_advantages=batch.advantages, reward_weight=cfg.mopd_reward_weight,
      **counts)


def _update_once(state: train.TrainState, batch: RLBatch, *, graph, opt,
                 cfg: RLConfig, moe: tuple, off_policy: bool,
                 correction: str):
  """One optimizer step on `batch`, its gradient over `cfg.micro_batches`."""
  k = cfg.micro_batches
  mask = batch.mask.astype(jnp.float32)
  # A micro-batch's loss and mean metrics divide by the whole batch's
  # counts, so that they add up to the batch's (k = 1: the loss's own).
  counts = {} if k == 1 else dict(
      num_tokens=mask.sum(), num_sequences=(mask.sum(-1) > 0).sum().astype(
          jnp.float32))
  n_tokens = jnp.maximum(counts.get('num_tokens', mask.sum()), 1.0)

  def loss_fn(params, mb: RLBatch):
    logp, ent, info = _forward_logp(params, state.rest, graph, _fwd(mb),
                                    mb.expert_idx, cfg.sample_config, moe,
                                    entropy=True)
    loss, m = _loss(logp, mb, cfg, off_policy, counts, correction)
    mb_mask = mb.mask.astype(jnp.float32)
    n = n_tokens if k > 1 else jnp.maximum(mb_mask.sum(), 1.0)
    return loss + info['aux_loss'] / k, dict(
        m, entropy=jnp.sum(ent * mb_mask) / n,
        **_on_policy_metrics(logp, mb, info, n))

  loss, m, grads = train.accumulate_gradients(
      loss_fn, state.params, batch, k, maxima=('dropped_learner',))
  state, grad_norm = train.apply_gradients(state, grads, opt)
  return state, dict(m, loss=loss, grad_norm=grad_norm)


@functools.partial(jax.jit, static_argnames=('graph', 'opt', 'cfg', 'moe',
                                             'correction'),
                   donate_argnums=0)
def update(state: train.TrainState, batch: RLBatch, *, graph, opt,
           cfg: RLConfig, moe: tuple = (), correction: str = 'none'):
  """`updates_per_batch` optimizer steps on a batch with advantages; (state, metrics).

  One step (the recipe's) is strictly on-policy. With more, the batch is
  split into that many minibatches of whole groups, one step each; every
  minibatch after the first is scored by a policy that has moved since
  sampling, and the sampler's log-probs are the old log-probs the clipped
  ratio is taken against. Each step's gradient is accumulated over
  `micro_batches` (the same objective). Metrics: means over the steps,
  worst cases (`*_max`, dropped fractions) maxima. `moe`: `exact_moe` of
  the batch (the default, (), keeps the model's configured dispatch, which
  may drop tokens under `capacity`). `correction`: see `_loss`
  (`RLConfig.correction` of the learner's dtype).
  """
  n = cfg.updates_per_batch
  step = functools.partial(_update_once, graph=graph, opt=opt, cfg=cfg,
                           moe=moe, off_policy=n > 1, correction=correction)
  if n == 1:
    return step(state, batch)
  mini = jax.tree.map(lambda x: x.reshape(n, -1, *x.shape[1:]), batch)
  state, ms = jax.lax.scan(step, state, mini)
  worst = lambda k: k.endswith('_max') or k.startswith('dropped')
  return state, {k: jnp.max(v) if worst(k) else jnp.mean(v)
                 for k, v in ms.items()}


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'moe'))
def proximal_logprobs(params, rest, batch: RLBatch, *, graph, cfg: RLConfig,
                      moe: tuple = ()):
  """The current policy's log-probs [B, T] of the batch's tokens, before an
  update: the proximal policy of the decoupled objective."""
  logp, _, _ = _forward_logp(params, rest, graph, _fwd(batch),
                             batch.expert_idx, cfg.sample_config, moe)
  return logp


@functools.partial(jax.jit, static_argnames=('graph', 'cfg', 'moe'))
def check_on_policy(params, rest, batch: RLBatch, *, graph, cfg: RLConfig,
                    moe: tuple = ()):
  """`update`'s on-policy metrics without an update (a step with nothing to
  learn from still logs them)."""
  logp, _, info = _forward_logp(params, rest, graph, _fwd(batch),
                                batch.expert_idx, cfg.sample_config, moe)
  n = jnp.maximum(batch.mask.astype(jnp.float32).sum(), 1.0)
  return _on_policy_metrics(logp, batch, info, n)


# ----------------------------------------------------------------- learner


def teacher_chunk(rows: int, teachers: int, rows_multiple: int = 1) -> int:
  """The rows of one MOPD teacher forward (`teacher_rows`): the batch's
  rows over the teachers, rounded up to a power of two and to a multiple
  of the devices the batch is split over, at most the batch's rows."""
  up = lambda n: -(-n // rows_multiple) * rows_multiple
  share = -(-rows // max(teachers, 1))
  return min(up(max(1 << (share - 1).bit_length(), rows_multiple)), up(rows))


def teacher_rows(domains, teachers, rows_multiple: int = 1
                 ) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
  """Which rows each MOPD teacher scores, a call at a time:
  {domain: [(gather [K], scatter [K]) of each call]}.

  A teacher runs on its own domain's rows alone (no teacher scores
  another's), K = `teacher_chunk` rows a call: the domain's rows padded
  with copies of its first row to whole chunks.
  The chunk is the same for every teacher and for every step of a stage
  whose batches keep their size: every teacher forward has one shape and
  compiles once (a domain's rows padded to their own power of two
  compiled once per size a step's mix gave: 5 times in the main job's
  MOPD). `scatter` is the rows the results go back to, with the batch's
  row count (out of range: dropped) for the padding.
  """
  doms = np.asarray(domains)
  missing = sorted({str(d) for d in doms} - set(teachers))
  if missing:
    raise ValueError(f'MOPD: no teacher for domains {missing}; teachers: '
                     f'{sorted(teachers)}')
  chunk = teacher_chunk(len(doms), len(teachers), rows_multiple)
  out = {}
  for dom in teachers:
    rows = np.flatnonzero(doms == dom)
    if not rows.size:
      continue
    pad = -rows.size % chunk
    gather = np.concatenate([rows, np.full(pad, rows[0])]).astype(np.int32)
    scatter = np.concatenate([rows, np.full(pad, len(doms))]).astype(np.int32)
    calls = len(gather) // chunk
    out[dom] = list(zip(np.split(gather, calls), np.split(scatter, calls)))
  return out


@jax.jit
def _take(fwd, rows):
  return {k: v[rows] for k, v in fwd.items()}


@functools.partial(jax.jit, static_argnames='first')
def _scatter(out, rows, values, *, first: bool = False):
  """`values` into rows `rows` of `out` (rows out of range: dropped);
  `first`: of zeros shaped like `out` (float32)."""
  if first:
    out = jnp.zeros(out.shape, jnp.float32)
  return out.at[rows].set(values, mode='drop')


@jax.jit
def _max(xs):
  return jnp.max(jnp.stack(xs))


@jax.jit
def _per_position(values, source_row):
  return jnp.take(values, source_row, axis=0, mode='fill', fill_value=0)


@functools.partial(jax.jit, static_argnames=('group_size', 'scale'))
def _advantages(rewards, *, group_size: int, scale: str):
  return losses.group_advantages(rewards, group_size, scale=scale)


class Learner:
  """From a collected `RLBatch` to the next train state: `step(state, batch)`.

  Holds what a step needs besides the state: the model's graph, the
  optimizer, the stage's RLConfig, the frozen reference (KL) and MOPD
  teachers, how batches are placed (`put`, `train.Setup.put`) and the
  largest MoE capacity used so far (`capacity`) and, packing, the largest
  row count (`pack_rows`); a run checkpoints both, so a resumed run
  computes with the shapes, and so the float sums, of an uninterrupted
  one.
  """

  def __init__(self, graph, opt, cfg: RLConfig, *,
               reference: Frozen | None = None,
               teachers: Mapping[str, Frozen] | None = None,
               put: Callable | None = None, rows_multiple: int = 1,
               capacity: int = 0, pack_rows: int = 0):
    self.graph, self.opt, self.cfg = graph, opt, cfg
    self.reference, self.teachers = reference, dict(teachers or {})
    self._put = put
    self.rows_multiple = rows_multiple
    self.capacity = capacity
    self.pack_rows = pack_rows
    self._model_cfg = None
    # Frozen models route with their own routers: a dropless path, fixed.
    self._frozen_moe = {name: exact_moe(f.cfg) for name, f in (
        [('reference', reference)] if reference is not None else []) + list(
            self.teachers.items())}

  def put(self, tree):
    """A host pytree on the devices (the stage's `Setup.put` on a mesh)."""
    return (self._put or jax.device_put)(tree)

  def model_cfg(self, state: train.TrainState) -> model_lib.ModelConfig:
    if self._model_cfg is None:
      self._model_cfg = nnx.merge(self.graph, state.params, state.rest).cfg
    return self._model_cfg

  def correction(self, state: train.TrainState) -> str:
    """The loss's behaviour correction: 'none' when the sampler samples
    from the learner's own weights in fp32 (`RLConfig.correction`)."""
    dtypes = {jnp.dtype(x.dtype) for x in jax.tree.leaves(state.params)
              if jnp.issubdtype(x.dtype, jnp.floating)}
    return 'none' if not dtypes else self.cfg.correction(
        max(dtypes, key=lambda d: d.itemsize), self.model_cfg(state).dtype)

  def check_rows(self, rows: int, where: str = '') -> None:
    """A clear error, before any work, unless a step's `rows` rollouts
    (rl.prompts_per_step x rl.rollouts_per_prompt) split as its update
    will split them: over the learner's devices (`rows_multiple`; times
    the micro-batches when packing) and into updates and micro-batches.
    `where`: what chose the devices, for the message."""
    multiple = self.rows_multiple * (self.cfg.micro_batches
                                     if self.cfg.pack_width else 1)
    if rows % multiple:
      raise ValueError(
          f'rl: a step\'s {rows} rollouts (rl.prompts_per_step x '
          f'rl.rollouts_per_prompt) do not split over the learner\'s '
          f'{self.rows_multiple} devices on its batch axes' + (
              f' x {self.cfg.micro_batches} micro-batches (packed)'
              if multiple != self.rows_multiple else '') + where +
          f': make the rollouts a multiple of {multiple}')
    if not self.cfg.pack_width:
      self.parts(rows)

  def parts(self, rows: int, packed: bool = False) -> list[np.ndarray]:
    """Row indices of each micro-batch of each update (the MoE capacity
    must fit the largest)."""
    n, k = self.cfg.updates_per_batch, self.cfg.micro_batches
    if packed:    # one update (RLConfig checks), rows of several groups
      train.check_micro_batches(rows, k, what='packed batch')
      return train.micro_batch_rows(rows, k)
    if rows % n or (rows // n) % self.cfg.rollouts_per_prompt:
      raise ValueError(
          f'rl.updates_per_batch={n} must split the {rows} rollouts into equal '
          f'minibatches of whole groups of {self.cfg.rollouts_per_prompt}')
    train.check_micro_batches(rows // n, k, what='minibatch')
    size = rows // n
    return [i * size + r for i in range(n)
            for r in train.micro_batch_rows(size, k)]

  def step(self, state: train.TrainState, batch: RLBatch
           ) -> tuple[train.TrainState, dict[str, float]]:
    """Advantages, frozen log-probs and the update on one host batch.

    The batch goes to the devices in one transfer; the metrics come back in
    one. A batch with nothing to learn from (`learn` False) takes no step:
    its metrics say only whether the learner scores what the sampler drew.
    """
    cfg, mcfg = self.cfg, self.model_cfg(state)
    if not batch.learn:
      moe = exact_moe(mcfg, batch)
      m = check_on_policy(state.params, state.rest, self.put(batch),
                          graph=self.graph, cfg=cfg, moe=moe)
      return state, _floats(sharding.to_host(m))
    length = float(batch.mask.sum(1).mean())
    if cfg.pack_width:
      batch = self.pack(batch)
    # The stage's first update sizes the capacity with headroom for the
    # batches to come (each new capacity compiles the update again).
    moe = exact_moe(mcfg, batch, min_capacity=self.capacity,
                    parts=self.parts(batch.num_rows, batch.packed),
                    headroom=0.0 if self.capacity else cfg.capacity_headroom)
    self.capacity = max(self.capacity, dict(moe).get('moe_capacity', 0))
    dev, extra = self.prepare(batch)
    if cfg.max_staleness and cfg.updates_per_batch > 1:
      dev = dev.replace(prox_logp=proximal_logprobs(
          state.params, state.rest, dev, graph=self.graph, cfg=cfg, moe=moe))
    state, m = update(state, dev, graph=self.graph, opt=self.opt, cfg=cfg,
                      moe=moe, correction=self.correction(state))
    m = _floats(sharding.to_host(dict(m, **extra)))
    if batch.packed:
      m['packed_rows'] = batch.num_rows
      m['packed_fill'] = float((np.asarray(batch.segment_ids) != 0).mean())
    return state, dict(m, moe_capacity=dict(moe).get('moe_capacity', 0),
                       response_length=length)

  def pack(self, batch: RLBatch) -> RLBatch:
    """`batch` packed into rows of `rl.pack_width` (`rl._batch.pack`), their
    count a multiple of the devices and micro-batches the update splits
    them over; the rewards (per rollout) must split likewise."""
    multiple = self.rows_multiple * self.cfg.micro_batches
    if batch.num_rows % multiple:
      raise ValueError(f'rl.pack_width: {batch.num_rows} rollouts do not split '
                       f'over {multiple} devices x micro-batches')
    # As the capacity: the stage's first batch sizes the rows with
    # headroom (or rl.pack_rows does), later ones only raise them (each
    # row count compiles).
    least = max(self.pack_rows, min(self.cfg.pack_rows, batch.num_rows))
    out = _batch.pack(
        batch, self.cfg.pack_width, multiple, min_rows=least,
        headroom=0.0 if least else self.cfg.capacity_headroom)
    self.pack_rows = out.num_rows
    return out

  def prepare(self, batch: RLBatch) -> tuple[RLBatch, dict[str, jax.Array]]:
    """The host batch on the devices (one transfer) with what the update
    needs besides the rollouts: group advantages, the reference's and the
    teachers' log-probs. Returns (device batch, the frozen forwards'
    dropped fractions)."""
    cfg = self.cfg
    plans = (teacher_rows(batch.domains, self.teachers, self.rows_multiple)
             if self.teachers else {})
    dev, plans = self.put((batch, plans))
    adv = _advantages(dev.rewards, group_size=cfg.rollouts_per_prompt,
                      scale=cfg.advantage_scale)
    if dev.packed:   # per rollout -> per position (padding: 0)
      adv = _per_position(adv, dev.source_row)
    dev = dev.replace(advantages=adv)
    extra = {}
    fwd = {k: getattr(dev, k) for k in _FORWARD}
    if self.reference is not None:
      ref_logp, extra['dropped_reference'] = frozen_logprobs(
          *self.reference, fwd, temperature=cfg.temperature,
          moe=self._frozen_moe['reference'])
      dev = dev.replace(ref_logp=ref_logp)
    if self.teachers:
      teacher_logp, extra['dropped_teacher'] = self._teacher_logp(fwd, plans)
      dev = dev.replace(teacher_logp=teacher_logp)
    return dev, extra

  def _teacher_logp(self, fwd, plans):
    """Each row's log-probs under its own domain's teacher (on the devices),
    and the largest dropped fraction of any teacher's forward. `plans`:
    `teacher_rows`' calls, on the devices."""
    out, dropped = None, []
    for dom, chunks in plans.items():
      t = self.teachers[dom]
      for gather, scatter in chunks:
        lp, dr = frozen_logprobs(*t, _take(fwd, gather),
                                 temperature=self.cfg.temperature,
                                 moe=self._frozen_moe[dom])
        out = _scatter(fwd['targets'] if out is None else out, scatter, lp,
                       first=out is None)
        dropped.append(dr)
    return out, _max(dropped)


def _floats(m: Mapping) -> dict[str, float]:
  return {k: float(v) for k, v in m.items()}
