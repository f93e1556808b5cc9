"""Ahead-of-time plans: compile a model's steps for a mesh from abstract arrays, and read their cost.

For each mesh of a plan config (configs/plan.py) this lowers and compiles,
with `jax.ShapeDtypeStruct`s only (no weights exist anywhere):

  sft      the SFT train step (forward, backward, AdamW) on packed rows
  grpo     the RL update on rollouts (routing replay, sampler log-probs)
  mopd     the same update with the teacher's log-probs
  prefill  the sampler's prompt pass, writing the KV cache (with the shape
           `prefill_rows`: continuous batching's, that many rows prefilled
           and written into the `rollout_rows`-row cache)
  decode   one sampler decode step over the cache (`row_index`: each row
           writes at its own slot, as continuous batching and episode
           slots decode; else one slot for the batch, a fixed batch's)
  feed     a multi-turn episode's observation fed in place
           (`rl.episode_slots`): every row's block of `APPEND_BUCKET`
           tokens through the model into the cache (one write index a row),
           the others' columns padding (`rollout.feed_fn`)
  sync     the weight sync: the sampler's copy of the learner's weights in
           the config's `sampler_dtype` and `sampler_layout`
           (`rl.SamplerWeights`' jitted cast and reshard)

The sampler's steps read weights in `sampler_dtype` ('' : the model's own)
and `sampler_layout` ('inference': `sharding.inference_rules`, no FSDP
gathers, experts over the FSDP and expert axes, MoE by the `ragged`
exchange; 'train': the learner's layout).

and reports, per device: `memory_analysis()` (arguments, outputs,
temporaries, aliased), `cost_analysis()` FLOPs and bytes accessed, an
estimated step time from published peaks (roofline: the larger of FLOPs
over peak FLOP/s and bytes over HBM bandwidth; communication not counted)
and whether it fits each accelerator's memory.

The devices are those of a TPU topology (libtpu's AOT topology API, on a
CPU-only host) when libtpu is installed, else fake CPU devices
(`--xla_force_host_platform_device_count`); the report names which. A CPU
compile has the TPU compile's argument sizes (the shardings), not its
temporaries or FLOPs (see the facts in the README's table).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import sft
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.aot._report import GB
from cascade_jax.aot._report import StepCost

STEPS = ('sft', 'grpo', 'mopd', 'prefill', 'decode', 'feed', 'sync')
TRAIN_STEPS = ('sft', 'grpo', 'mopd')
SAMPLER_STEPS = ('prefill', 'decode', 'feed', 'sync')

# ------------------------------------------------------------------ devices


def devices(n: int, topology: str = '') -> tuple[list, str]:
  """(n devices, what they are): a TPU topology's, or fake CPU devices."""
  if topology:
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    topo = topologies.get_topology_desc(platform='tpu', topology_name=topology)
    devs = list(topo.devices)
    if len(devs) != n:
      raise ValueError(f'plan: topology {topology!r} has {len(devs)} devices, '
                       f'the mesh needs {n}')
    return devs, f'tpu {topology} ({devs[0].device_kind})'
  cpus = jax.devices('cpu')
  if len(cpus) < n:
    raise ValueError(
        f'plan: a mesh of {n} devices, but this process has {len(cpus)} CPU '
        'devices: start it with XLA_FLAGS=--xla_force_host_platform_device_'
        f'count={n} or more (experiments.plan does)')
  return cpus[:n], 'cpu (fake devices)'


def libtpu_available() -> bool:
  return importlib.util.find_spec('libtpu') is not None


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


# --------------------------------------------------------------------- plan


def _cost(compiled) -> tuple[float, float]:
  ca = compiled.cost_analysis()
  if isinstance(ca, (list, tuple)):   # older jax: one dict per program
    ca = ca[0] if ca else {}
  ca = ca or {}
  return float(ca.get('flops', 0.0)), float(ca.get('bytes accessed', 0.0))


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a pytree of sharded ShapeDtypeStructs."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def _abstract_step(step: str, cfg, ctx, opt, shapes):
  """(jitted fn, abstract args, static kwargs, tokens it processes)."""
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
  return _abstract_rollout(cfg, ctx, rows, shapes['prompt_len'],
                           shapes['cache_len'], step, model_ctx,
                           weight_layout, copied, chunk,
                           bool(shapes.get('row_index', 0))) + (
                               chunk * shapes['prompt_len'] if step == 'prefill'
                               else rows * rollout.APPEND_BUCKET
                               if step == 'feed' else rows,)


def _compile(step: str, cfg, ctx, opt, shapes):
  """(compiled step, tokens it processes, bytes of state per device)."""
  fn, args, kw, tokens = _abstract_step(step, cfg, ctx, opt, shapes)
  # The weights (and optimizer state) one device holds, from the shapes.
  state = args[0] if step in TRAIN_STEPS + ('sync',) else args[1]
  # Traced with the mesh's first device as the default: the ops pick their
  # kernels by its platform (a TPU topology's: splash, tokamax).
  dev = ctx.mesh.devices.flat[0]
  opts = dict(_TPU_OPTIONS) if dev.platform == 'tpu' else {}
  with jax.default_device(dev):
    return (fn.lower(*args, **kw).compile(compiler_options=opts or None),
            tokens, per_device_bytes(state))


# XLA options for the TPU compiles of one `run` (a config's
# `tpu_compiler_options`, e.g. MaxText's xla_tpu_scoped_vmem_limit_kib).
_TPU_OPTIONS: dict = {}


@contextlib.contextmanager
def _tpu_options(options: Mapping[str, Any]):
  before = dict(_TPU_OPTIONS)
  _TPU_OPTIONS.clear()
  _TPU_OPTIONS.update(options)
  try:
    yield
  finally:
    _TPU_OPTIONS.clear()
    _TPU_OPTIONS.update(before)


def depth_cost(step: str, cfg, ctx, opt, shapes) -> tuple[float, float]:
  """(FLOPs, bytes accessed) per device of the step at the model's depth.

  XLA's cost analysis counts a loop body once, so a scanned model's
  compiled figures miss every repeat but one. These come from the step
  compiled unrolled at one and at two repeats of the pattern's unit,
  extrapolated linearly to the model's repeats (the embedding, head, loss
  and optimizer are the intercept, each unit the slope).
  """
  unit, repeats = cfg.layer_groups[0]
  rest = cfg.pattern[len(unit) * repeats:]     # the unrolled layers after it
  if repeats == 1:
    return _cost(_compile(step, cfg.replace(scan_layers=False), ctx, opt,
                          shapes)[0])
  costs = [_cost(_compile(step, cfg.replace(pattern=unit * r + rest,
                                            scan_layers=False),
                          ctx, opt, shapes)[0]) for r in (1, 2)]
  return tuple(a + (b - a) * (repeats - 1) for a, b in zip(*costs))


def compile_step(step: str, cfg, ctx, opt, shapes, platform: str, mesh_name,
                 *, with_cost: bool = True):
  """One step lowered and compiled on `ctx`'s mesh: its StepCost.

  `with_cost` False skips `depth_cost` (two more compiles of the step):
  FLOPs and bytes are then NaN.
  """
  n = ctx.mesh.size
  t0 = time.perf_counter()
  ops.reset_selected()
  try:
    compiled, tokens, state_bytes = _compile(step, cfg, ctx, opt, shapes)
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    cost = _out_of_memory(step, cfg, ctx, opt, shapes, platform, mesh_name,
                          str(e), time.perf_counter() - t0)
    cost.ops = picked_ops()
    return cost
  dt = time.perf_counter() - t0
  picked = picked_ops()
  mem = compiled.memory_analysis()
  if (step in SAMPLER_STEPS or cfg.layer_groups[0][1] == 1 or
      not cfg.scan_layers):
    # Unrolled already (the sampler's steps run `rollout.forward` over every
    # layer's view and the sync casts each stacked weight whole; a pattern
    # with no repeated prefix, or scanning off): the compiled figures are
    # the full depth. (A depth extrapolation of the sync's reshard was not
    # linear: negative FLOPs on v5p-64.)
    flops, nbytes = _cost(compiled)
  elif with_cost:
    flops, nbytes = depth_cost(step, cfg, ctx, opt, shapes)
  else:
    flops, nbytes = math.nan, math.nan
  return StepCost(
      step=step, mesh=mesh_name, devices=n, platform=platform, tokens=tokens,
      argument_bytes=int(mem.argument_size_in_bytes),
      output_bytes=int(mem.output_size_in_bytes),
      temp_bytes=int(mem.temp_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), flops=flops,
      bytes_accessed=nbytes, compile_s=dt,
      state_bytes=state_bytes,
      model_flops=model_flops(step, cfg, tokens,
                              attention_context(step, shapes)) / n,
      ops=picked)


def picked_ops() -> str:
  """What `ops.selected` recorded since its last reset, one entry an op:
  'attention=splash, cache_attention=pallas, ...' (several: '/'-joined)."""
  return ', '.join(
      f'{op}=' + '/'.join(sorted({c.split(' ')[0] for c in choices}))
      for op, choices in sorted(ops.selected().items()))


def _out_of_memory(step, cfg, ctx, opt, shapes, platform, mesh_name, error,
                   seconds) -> StepCost:
  """The StepCost of a step the compiler refused for want of device memory
  (a real TPU compile checks the chip's HBM): what it said it needs."""
  _, args, _, tokens = _abstract_step(step, cfg, ctx, opt, shapes)
  state = args[0] if step in TRAIN_STEPS + ('sync',) else args[1]
  found = re.search(r'HLO temporaries \(([\d.]+)([KMGT])\)', error)
  scale = dict(K=1e3, M=1e6, G=1e9, T=1e12)
  temp = float(found.group(1)) * scale[found.group(2)] if found else math.nan
  start = error.find('RESOURCE_EXHAUSTED')
  line = ' '.join(error[max(start, 0):].split())
  first = re.match(r'.*?\.(\s|$)', line)
  return StepCost(
      step=step, mesh=mesh_name, devices=ctx.mesh.size, platform=platform,
      tokens=tokens, argument_bytes=per_device_bytes(args),
      output_bytes=0, temp_bytes=int(temp) if temp == temp else 0,
      alias_bytes=0, flops=math.nan, bytes_accessed=math.nan,
      compile_s=seconds, state_bytes=per_device_bytes(state),
      model_flops=model_flops(step, cfg, tokens,
                              attention_context(step, shapes)) / ctx.mesh.size,
      note=(first.group(0).strip() if first else line)[:300],
      error=error[max(start, 0):])


def model_flops(step: str, cfg, tokens: int, context: float = 0.0) -> float:
  """Counted FLOPs of a step: 2 x active weights (input embedding excluded)
  x tokens a forward, plus attention's scores and weighted values, 4 x heads
  x head_dim x `context` (the keys a query sees on average) per token and
  attention layer; a training step's backward twice the forward, plus a
  forward again under full remat. Mamba-2's scan is not counted."""
  if step == 'sync':   # a cast: no matmul
    return 0.0
  pc = model_lib.count_params(cfg)
  per_token = 2 * (pc.active - pc.embedding)
  per_token += (4 * cfg.num_heads * cfg.head_dim * context *
                cfg.pattern.count(model_lib.ATTENTION))
  if step in SAMPLER_STEPS:
    return per_token * tokens
  return per_token * tokens * (4 if cfg.remat == 'full' else 3)


def attention_context(step: str, shapes: Mapping[str, int]) -> float:
  """The keys a query sees on average in `step` (causal rows: half the row;
  a decode step or an episode's fed block: the whole cache, an upper
  bound)."""
  return {'sft': shapes.get('sft_seq', 0) / 2,
          'grpo': shapes.get('rl_seq', 0) / 2,
          'mopd': shapes.get('rl_seq', 0) / 2,
          'prefill': shapes.get('prompt_len', 0) / 2,
          'decode': shapes.get('cache_len', 0),
          'feed': shapes.get('cache_len', 0), 'sync': 0}[step]


def model_config(config: ml_collections.ConfigDict) -> model_lib.ModelConfig:
  cfg = train.model_config(config.model.preset,
                           config.model.overrides.to_dict())
  return cfg.replace(**train.memory_overrides(config))


def run(config: ml_collections.ConfigDict, *, progress=print,
        on_step=None) -> list[StepCost]:
  """Compiles every step of `config.steps` on every mesh of `config.meshes`.

  `on_step(costs so far)` runs after each step (the launcher writes its
  results file there: a long plan's finished steps are kept).
  """
  # Strict (the default here): a kernel that would fall back at a planned
  # shape is an error naming the op, the shape and why, not a quiet XLA op.
  options = (config.tpu_compiler_options.to_dict()
             if config.get('tpu_compiler_options') else {})
  with ops.strict_mode(config.get('ops_strict', True)), _tpu_options(options):
    return _run(config, progress, on_step)


def _run(config, progress, on_step) -> list[StepCost]:
  cfg = model_config(config)
  opt = train.make_optimizer(train.OptimConfig(
      moment_dtype=config.get('moment_dtype', 'float32')))
  rules = sharding.rules_from_config(
      config.rules.to_dict() if config.get('rules') else None)
  steps = [s.strip() for s in config.steps.split(',') if s.strip()]
  unknown = sorted(set(steps) - set(STEPS))
  if unknown:
    raise ValueError(f'plan: unknown steps {unknown}; known: {STEPS}')
  use_tpu = config.platform == 'tpu' or (config.platform == 'auto' and
                                         libtpu_available())
  only = [s.strip() for s in config.get('only', '').split(',') if s.strip()]
  missing = sorted(set(only) - set(config.meshes))
  if missing:
    raise ValueError(f'plan: only names meshes {missing} that config.meshes '
                     f'does not define ({sorted(config.meshes)})')
  out = []
  meshes = sorted(config.meshes.items(), key=lambda kv: math.prod(
      v for k, v in kv[1].to_dict().items() if k in sharding.MESH_AXES))
  for name, spec in meshes:
    if only and name not in only:
      continue
    spec = spec.to_dict()
    topology = spec.pop('topology', '') if use_tpu else ''
    spec.pop('topology', None)
    shape = {k: v for k, v in spec.items() if k in sharding.MESH_AXES}
    n = math.prod(shape.values())
    devs, platform = devices(n, topology)
    if use_tpu and not topology:
      raise ValueError(f'plan: mesh {name} names no TPU topology')
    ctx = sharding.ShardingCtx(sharding.make_mesh(shape, devs), rules)
    cost_meshes = [m.strip() for m in config.get('cost_meshes', '').split(',')
                   if m.strip()]
    for variant, over in _variants(config):
      shapes = dict(mesh_shapes({**config.shapes.to_dict(), **over}, n),
                    sampler_dtype=config.get('sampler_dtype', ''),
                    sampler_layout=config.get('sampler_layout', 'inference'),
                    sampler_weight_layout=config.get('sampler_weight_layout',
                                                     'auto'))
      for step in steps:
        cost = compile_step(step, cfg, ctx, opt, shapes, platform, name,
                            with_cost=not cost_meshes or name in cost_meshes)
        cost.variant = variant
        progress(f'[plan] {name} ({n} devices, {platform}) {step}'
                 f'{" " + variant if variant else ""}: '
                 f'{cost.peak_bytes / GB:.2f} GB/device, '
                 f'{cost.flops:.3g} FLOPs, compiled in {cost.compile_s:.1f}s'
                 + (f' ({cost.note})' if cost.note else ''))
        out.append(cost)
        if on_step is not None:
          on_step(out)
  return out


def mesh_shapes(shapes: Mapping[str, int], devices: int) -> dict[str, int]:
  """A config's shapes -> the shapes a mesh of `devices` compiles.

  `*_rows` are per device (times `devices` here). `rl_batch`, if set, is
  the rollouts of one RL step over the whole mesh (the recipe's 128 prompts
  x 16): each device then takes rl_batch / devices of them in micro-batches
  of `rl_rows_per_micro`, one optimizer step (`rl_rows` and
  `rl_micro_batches` follow from it).
  """
  out = {k: int(v) * (devices if k.endswith('_rows') else 1)
         for k, v in shapes.items()}
  batch, per_micro = out.pop('rl_batch', 0), out.pop('rl_rows_per_micro', 1)
  if batch:
    if batch % (devices * per_micro):
      raise ValueError(
          f'plan: rl_batch {batch} does not split into {devices} devices x '
          f'micro-batches of rl_rows_per_micro={per_micro} rollouts')
    out['rl_rows'] = batch
    out['rl_micro_batches'] = batch // (devices * per_micro)
  return out


def _variants(config) -> list[tuple[str, dict]]:
  """(name, shape overrides) to compile each step at: the config's
  `variants` (e.g. rollouts per device x micro-batches), else its shapes."""
  variants = dict(config.get('variants') or {})
  for name, over in variants.items():
    unknown = sorted(set(over) - set(config.shapes))
    if unknown:
      raise ValueError(f'plan: variant {name!r} sets {unknown}, which are not '
                       f'shapes ({sorted(config.shapes)})')
  # Rows first, then the rest (micro-batches): the table reads in order.
  order = lambda kv: [v for _, v in sorted(
      kv[1].items(), key=lambda x: (not x[0].endswith('_rows'), x[0]))]
  return sorted(((k, dict(v)) for k, v in variants.items()),
                key=order) or [('', {})]
