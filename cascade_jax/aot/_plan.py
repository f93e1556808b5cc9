"""Ahead-of-time plans: compile a model's steps for a mesh from abstract arrays, and read their cost.

For each mesh of a plan config (configs/plan.py) this lowers and compiles,
with `jax.ShapeDtypeStruct`s only (no weights exist anywhere; each step's
function and abstract arguments: `_steps.abstract_step`):

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
import importlib.util
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.aot._report import GB
from cascade_jax.aot._report import StepCost
from cascade_jax.aot._steps import abstract_step as _abstract_step
from cascade_jax.aot._steps import SAMPLER_STEPS
from cascade_jax.aot._steps import step_state
from cascade_jax.aot._steps import STEPS


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


def _compile(step: str, cfg, ctx, opt, shapes):
  """(compiled step, tokens it processes, bytes of state per device)."""
  fn, args, kw, tokens = _abstract_step(step, cfg, ctx, opt, shapes)
  # The weights (and optimizer state) one device holds, from the shapes.
  state = step_state(step, args)
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
  state = step_state(step, args)
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
