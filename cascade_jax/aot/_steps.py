"""The plan's steps as abstract programs: each step's jitted function and its sharded arguments.

Nothing here is compiled or allocated: `abstract_step` gives what
`cascade_jax.aot._plan` lowers and compiles for a mesh, from
`jax.ShapeDtypeStruct`s only. The training steps (sft, grpo, mopd) run on
the learner's state; the sampler's (prefill, decode, feed) on its weights
as the weight sync writes them; sync is that weight sync (see the steps
in `_plan`'s docstring).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cascade_jax import model as model_lib
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import sft
from cascade_jax import sharding
from cascade_jax import train

STEPS = ('sft', 'grpo', 'mopd', 'prefill', 'decode', 'feed', 'sync')
TRAIN_STEPS = ('sft', 'grpo', 'mopd')
SAMPLER_STEPS = ('prefill', 'decode', 'feed', 'sync')


# ------------------------------------------------------------ abstract state


def _sds(shape, dtype, s):
  return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=s)


def abstract_train_state(cfg: model_lib.ModelConfig, ctx: sharding.ShardingCtx,
                         opt: optax.GradientTransformation):
  """(graph, TrainState of ShapeDtypeStructs), sharded as a stage shards it."""
  model = train.abstract_model(cfg, ctx)
  graph, params, rest = nnx.split(model, nnx.Param, ...)
  shardings = train.opt_state_shardings(opt, params)
  opt_state = jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s),
                           jax.eval_shape(opt.init, params), shardings)
  step = _sds((), jnp.int32, NamedSharding(ctx.mesh, P()))
  return graph, train.TrainState(params, rest, opt_state, step)


def _rows(ctx, names_shapes: Mapping[str, tuple], dtypes: Mapping[str, str]):
  """Batch arrays [B, ...] split over the `batch` rule's axes."""
  return {k: _sds(shape, dtypes.get(k, 'int32'), ctx.sharding(
      ('batch',) + (None,) * (len(shape) - 1), shape))
          for k, shape in names_shapes.items()}


# -------------------------------------------------------------------- steps
# Each `_abstract_*` builds a step's jitted function and its abstract
# arguments (ShapeDtypeStructs with shardings); `_compile` lowers them.


def _abstract_sft(cfg, ctx, opt, rows, seq, micro_batches=1):
  graph, state = abstract_train_state(cfg, ctx, opt)
  keys = ('inputs', 'targets', 'positions', 'segment_ids', 'mask')
  batch = _rows(ctx, {k: (rows, seq) for k in keys}, {})
  n_moe = cfg.pattern.count(model_lib.MOE)
  return sft.train_step, (state, batch), dict(
      graph=graph, opt=opt, accum=micro_batches,
      bias_rate=1e-3 if cfg.moe and cfg.moe.use_expert_bias else 0.0,
      n_moe=n_moe)


def _abstract_rl(cfg, ctx, opt, rows, seq, algorithm, micro_batches=1):
  """The RL update on `rows` rollouts of `seq` tokens (the sampler's
  routing replayed), its gradient over `micro_batches`."""
  graph, state = abstract_train_state(cfg, ctx, opt)
  shapes = {k: (rows, seq) for k in ('inputs', 'targets', 'positions',
                                     'segment_ids', 'mask', 'sampler_logp')}
  shapes['rewards'] = shapes['advantages'] = (rows,)
  n_moe = cfg.pattern.count(model_lib.MOE)
  if n_moe:   # the rollout's routing, replayed
    shapes['expert_idx'] = (rows, seq, n_moe, cfg.moe.top_k)
  if algorithm == 'mopd':
    shapes['teacher_logp'] = (rows, seq)
  f32 = 'float32'
  batch = rl.RLBatch(**_rows(ctx, shapes, dict(
      sampler_logp=f32, rewards=f32, advantages=f32, teacher_logp=f32)))
  rc = rl.RLConfig(algorithm=algorithm, rollouts_per_prompt=16,
                   dynamic_filtering=False, micro_batches=micro_batches)
  # The behaviour correction the learner would apply (bf16 compute: 'tis').
  return rl.update, (state, batch), dict(
      graph=graph, opt=opt, cfg=rc, moe=(),
      correction=rc.correction(cfg.param_dtype, cfg.dtype))


def _abstract_cache(cfg, ctx, rows, length, row_index=False):
  """The sampler's KV cache of `rows` rows; `row_index`: a write index a
  row (continuous batching's), else one for the batch."""
  cache = jax.eval_shape(lambda: model_lib.init_cache(cfg, rows, length))
  kv = lambda a: _sds(a.shape, a.dtype, ctx.sharding(
      ('batch', 'kv_heads', None, None), a.shape))
  rowwise = lambda a: _sds(a.shape, a.dtype, ctx.sharding(('batch', None),
                                                          a.shape))
  axes = model_lib.mamba_state_axes()
  mamba = tuple(
      model_lib.MambaState(*(_sds(a.shape, a.dtype, ctx.sharding(ax, a.shape))
                             for a, ax in zip(st, axes)))
      for st in cache.mamba)
  return model_lib.KVCache(
      k=tuple(kv(a) for a in cache.k), v=tuple(kv(a) for a in cache.v),
      positions=rowwise(cache.positions),
      segment_ids=rowwise(cache.segment_ids),
      index=(_sds((rows,), jnp.int32, ctx.sharding(('batch',), (rows,)))
             if row_index else
             _sds((), jnp.int32, NamedSharding(ctx.mesh, P()))),
      mamba=mamba)


def _prompt_pass(model, cache, tokens):
  """The sampler's prefill of `tokens` [B, T] into `cache` (B rows, empty)."""
  b, t = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  logits, cache, _ = rollout.forward(
      model, tokens, positions_bt=pos, segment_ids_bt=jnp.ones_like(tokens),
      cache=cache, layouts=rollout.model_decode_weights(model, b),
      last_logits_only=True, fresh=True)
  return logits, cache


@functools.partial(jax.jit, static_argnames=('graph',), donate_argnums=(2,))
def _prefill(graph, state, cache, tokens):
  return _prompt_pass(nnx.merge(graph, state), cache, tokens)


@functools.partial(jax.jit, static_argnames=('graph',), donate_argnums=(2,))
def _prefill_into(graph, state, cache, tokens, which):
  """Continuous batching's prefill of k prompts (`rl.prefill_rows`,
  `rollout.generate_continuous`): into a fresh k-row cache, then written
  into rows `which` of the sampler's B-row cache (donated: in place)."""
  model = nnx.merge(graph, state)
  k, t = tokens.shape
  logits, fresh = _prompt_pass(
      model, model_lib.init_cache(model.cfg, k, cache.max_len), tokens)
  cache = rollout.put_rows(cache, fresh, which, jnp.full((k,), t, jnp.int32))
  return logits, sharding.constrain_rows(model.ctx, cache)


@functools.partial(jax.jit, static_argnames=('graph',), donate_argnums=(2,))
def _decode(graph, state, cache, tokens):
  model = nnx.merge(graph, state)
  b = tokens.shape[0]
  # One write index for the batch (a fixed batch), or one a row
  # (continuous batching, episode slots: each row at its own slot).
  index = cache.index[:, None] if cache.index.ndim else cache.index
  pos = jnp.broadcast_to(index, (b, 1)).astype(jnp.int32)
  logits, cache, _ = rollout.forward(
      model, tokens, positions_bt=pos, segment_ids_bt=jnp.ones_like(tokens),
      cache=cache, layouts=rollout.model_decode_weights(model, b))
  return logits, cache


def _sampler_cfg(cfg, shapes):
  """The model config of the sampler's weights (`sampler_dtype`)."""
  dtype = shapes.get('sampler_dtype') or cfg.param_dtype
  return cfg.replace(param_dtype=dtype)


def _sampler_ctx(cfg, ctx, shapes):
  """The mesh and rules of the sampler's weights (`sampler_layout`)."""
  return rl.sampler_ctx(cfg, ctx, shapes.get('sampler_layout', 'inference'))


def _abstract_sync(cfg, ctx, shapes):
  """The weight sync: the learner's weights cast to the sampler's dtype and
  placed in its layout (`rl.SamplerWeights`)."""
  _, params, rest = nnx.split(train.abstract_model(cfg, ctx), nnx.Param, ...)
  target = rl.sampler_state(cfg, _sampler_cfg(cfg, shapes).param_dtype,
                            _sampler_ctx(cfg, ctx, shapes))[1:]
  formats = (rl.weight_formats(target)
             if _weight_layout(ctx, shapes) == 'decode' else None)
  return rl.sync_fn(target, formats), ((params, rest),), {}


def _weight_layout(ctx, shapes) -> str:
  """The sampler's weight layout on `ctx`'s platform (`sampler_weight_layout`)."""
  return rl.resolve_weight_layout(shapes.get('sampler_weight_layout', 'auto'),
                                  ctx.mesh.devices.flat[0].platform)


def _abstract_rollout(cfg, ctx, rows, prompt, length, which, model_ctx=None,
                      weight_layout='default', layer_arrays=False,
                      prefill_rows=0, row_index=False):
  """The sampler's prefill, decode or feed step on its weights as the
  weight sync writes them: in `weight_layout`, and one array a layer
  (`layer_arrays`) where the sync copies them (`rl.sampler_tree`). A feed
  is episode slots': a block of `rollout.APPEND_BUCKET` tokens a row, each
  row at its own write index. A decode with `row_index` writes each row at
  its own index too (`rl.sample_slots`' and `rl.episode_slots`' decode),
  else at one for the batch (fixed batches). A prefill of `prefill_rows`
  (fewer than `rows`) is continuous batching's: those rows prefilled, then
  written into the `rows`-row cache."""
  model = train.abstract_model(cfg, model_ctx or ctx)
  graph, state = nnx.split(model)
  state = rl.sampler_tree(
      state, rl.weight_formats(state) if weight_layout == 'decode' else None,
      layer_arrays=layer_arrays)
  if which == 'feed':
    cache = _abstract_cache(cfg, ctx, rows, length, row_index=True)
    w = rollout.APPEND_BUCKET
    block = _rows(ctx, {'tokens': (rows, w), 'valid': (rows, w),
                        'pos': (rows, w), 'logits': (rows, cfg.vocab_size)},
                  {'valid': 'bool', 'logits': 'float32'})
    return rollout.feed_fn(cfg), (
        graph, state, block['tokens'], block['valid'], block['pos'], cache,
        block['logits']), {}
  if which == 'prefill' and 0 < prefill_rows < rows:
    cache = _abstract_cache(cfg, ctx, rows, length, row_index=True)
    new = _rows(ctx, {'tokens': (prefill_rows, prompt),
                      'which': (prefill_rows,)}, {})
    return _prefill_into, (graph, state, cache, new['tokens'],
                           new['which']), {}
  cache = _abstract_cache(cfg, ctx, rows, length,
                         row_index=row_index and which == 'decode')
  t = prompt if which == 'prefill' else 1
  tokens = _rows(ctx, {'tokens': (rows, t)}, {})['tokens']
  fn = _prefill if which == 'prefill' else _decode
  return fn, (graph, state, cache, tokens), {}


def abstract_step(step: str, cfg, ctx, opt, shapes):
  """(jitted fn, abstract args, static kwargs, tokens it processes) of
  `step` (one of STEPS) at `shapes` (a mesh's: `_plan.mesh_shapes`)."""
  if step == 'sft':
    rows, seq = shapes['sft_rows'], shapes['sft_seq']
    return _abstract_sft(cfg, ctx, opt, rows, seq,
                         shapes.get('sft_micro_batches', 1)) + (rows * seq,)
  if step in ('grpo', 'mopd'):
    rows, seq = shapes['rl_rows'], shapes['rl_seq']
    return _abstract_rl(cfg, ctx, opt, rows, seq, step,
                        shapes.get('rl_micro_batches', 1)) + (rows * seq,)
  if step == 'sync':
    return _abstract_sync(cfg, ctx, shapes) + (0,)
  rows = shapes['rollout_rows']
  model_ctx = _sampler_ctx(cfg, ctx, shapes)
  weight_layout = _weight_layout(ctx, shapes)
  learner = nnx.split(train.abstract_model(cfg, ctx), nnx.Param, ...)[1:]
  cfg = _sampler_cfg(cfg, shapes)
  target = rl.sampler_state(cfg, cfg.param_dtype, model_ctx)[1:]
  copied = rl.splits_always(
      cfg, ctx.mesh.devices.flat[0].platform) or rl.sync_copies(
          learner, target, (rl.weight_formats(target)
                            if weight_layout == 'decode' else None))
  chunk = min(shapes.get('prefill_rows', 0) or rows, rows)
  tokens = {'prefill': chunk * shapes['prompt_len'],
            'feed': rows * rollout.APPEND_BUCKET}.get(step, rows)
  return _abstract_rollout(cfg, ctx, rows, shapes['prompt_len'],
                           shapes['cache_len'], step, model_ctx,
                           weight_layout, copied, chunk,
                           bool(shapes.get('row_index', 0))) + (tokens,)


def step_state(step: str, args) -> object:
  """The weights (and optimizer state) a step's abstract `args` hold."""
  return args[0] if step in TRAIN_STEPS + ('sync',) else args[1]
