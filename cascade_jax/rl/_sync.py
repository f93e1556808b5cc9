"""The weight sync: the sampler's copy of the policy, made from the learner's state after each update.

The learner keeps fp32 master weights in the training layout (FSDP over
`embed`). The sampler reads them
- in `RLConfig.sampler_dtype`: bf16 at scale, half the bytes each decode
  step streams;
- on a mesh, in the inference layout (`RLConfig.sampler_layout`,
  `sharding.inference_rules`): no FSDP on weights and the experts split over
  the FSDP and expert axes, so a decode step sends tokens to the experts'
  devices (the `ragged` exchange) and never all-gathers a weight.
The copy is one jitted function of the train state's parameters (cast and
reshard together), so no weight crosses the host. A copy at the learner's
dtype (the main job: fp32 on one device, where the copy only splits the
layers, below) holds the learner's values exactly: the sampler stays
exactly on-policy. A reshard alone is exact too: the loss corrects only
for the dtype (`RLConfig.correction`). Off the CPU, where neither dtype nor
layout differs, nothing is copied and the sampler reads the learner's own
arrays.

- in memory, each weight in the layout the sampler's programs read
  (`RLConfig.sampler_weight_layout`, `weight_formats`): on TPU the
  attention's input projections with the embed axis minor, which the
  decode step's matmuls otherwise re-lay out from the learner's layout on
  every step (Qwen3-30B-A3B at 32 chips: 35.4 -> 30.6 GB of HBM accessed
  a decode step, docs/results/archive/plan_decode_layouts_2026-12-04).
- in memory, each stacked layer weight as one array per layer
  (`model.LayerArrays`): a program then reads a layer's weights as a
  buffer of their own, where XLA copies a slice of a stacked array out
  wherever an operation needs one (on TPU the MoE layer's conditional;
  Qwen3-30B-A3B's decode step 19.58 -> 14.51 GB of HBM a chip,
  docs/results/archive/plan_decode_bytes_2026-12-05; XLA:CPU at every decode
  step, so on the CPU the sync always splits a layer group deeper than
  one: docs/results/archive/sampler_layer_arrays_cpu_2026-12-05).
A sampler in a process of its own (`rl.rollout_worker='process'`,
`rl._decoupled`) is sent this copy as host arrays after each update, one
array a layer.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental.layout import Format
from jax.experimental.layout import Layout

from cascade_jax import model as model_lib
from cascade_jax import sharding
from cascade_jax import train
from cascade_jax.rl._config import SAMPLER_LAYOUTS
from cascade_jax.rl._config import SAMPLER_WEIGHT_LAYOUTS


def sampler_state(cfg: model_lib.ModelConfig, dtype: str,
                  ctx: sharding.ShardingCtx | None):
  """(graph, params, rest) of the sampler's model, abstract: `cfg` with
  `param_dtype=dtype` (leaves the model pins, such as the fp32 router,
  stay as they are), on `ctx` as its rules place it (None: one device)."""
  return nnx.split(model_lib.abstract_model(cfg.replace(param_dtype=dtype),
                                            ctx), nnx.Param, ...)


def sampler_ctx(cfg: model_lib.ModelConfig, ctx: sharding.ShardingCtx | None,
                layout: str = 'inference') -> sharding.ShardingCtx | None:
  """The mesh and rules of the sampler's weights: `ctx` with the inference
  rules (`ShardingCtx.for_inference`), or `ctx` itself for layout 'train'
  or off a mesh."""
  if ctx is None or layout == 'train':
    return ctx
  return ctx.for_inference(None if cfg.moe is None else cfg.moe.num_experts)


def inference_layout(cfg: model_lib.ModelConfig, ctx: sharding.ShardingCtx):
  """(graph, param shardings, rest shardings) of a model of `cfg` on `ctx`'s
  mesh in the inference layout (`ShardingCtx.for_inference`)."""
  g, p, r = nnx.split(model_lib.abstract_model(cfg, sampler_ctx(cfg, ctx)),
                      nnx.Param, ...)
  shard = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
  return g, shard(p), shard(r)


# The weights that `decode` lays out with their embed axis (the matmul's
# contracting axis) minor: the attention's input projections [.., D, N, H].
# What XLA:TPU chose for the sampler's weights when left to choose
# (`Layout.AUTO` on the decode step, Qwen3-30B-A3B, v5p): these three
# transposed, every other weight as the learner holds it.
DECODE_MINOR = frozenset({'w_q_dnh', 'w_k_dkh', 'w_v_dkh'})


def resolve_weight_layout(layout: str, platform: str) -> str:
  """`RLConfig.sampler_weight_layout` on a platform: 'auto' is 'decode'
  on TPU (where it was measured) and 'default' elsewhere (XLA:CPU's and
  XLA:GPU's decode matmuls were not measured with it)."""
  if layout not in SAMPLER_WEIGHT_LAYOUTS:
    raise ValueError(f'rl.sampler_weight_layout: {layout!r} not in '
                     f'{SAMPLER_WEIGHT_LAYOUTS}')
  if layout == 'auto':
    return 'decode' if platform == 'tpu' else 'default'
  return layout


def embed_minor(ndim: int) -> Layout:
  """The layout of a [.., D, N, H] weight with D (axis ndim - 3) minor."""
  return Layout(major_to_minor=(*range(ndim - 3), ndim - 2, ndim - 1,
                                ndim - 3))


def weight_formats(target, default_sharding=None):
  """`target` (abstract (params, rest)) with each `DECODE_MINOR` weight's
  sharding replaced by a `Format` of it in the `embed_minor` layout: the
  `decode` weight layout, as `sync_fn` writes it and the sampler's
  programs read it. Leaves without a sharding (one device) take
  `default_sharding`."""
  def fmt(path, t):
    sh = getattr(t, 'sharding', None) or default_sharding
    names = {getattr(k, 'key', getattr(k, 'name', None)) for k in path}
    if names & DECODE_MINOR and t.ndim >= 3:
      return Format(embed_minor(t.ndim), sh)
    return sh
  return jax.tree_util.tree_map_with_path(fmt, target)


def copies(learner, target, formats=None, *, moves: bool | None = None
           ) -> bool:
  """Whether the sampler needs a copy of the `learner`'s (params, rest) to
  read them as `target` (abstract) in `formats`: a weight is wider than the
  sampler's model holds it, a placement differs (`moves`, computed from
  the shardings where not given), or `formats` lays them out."""
  narrows = any(
      jnp.issubdtype(x.dtype, jnp.floating) and
      x.dtype.itemsize > t.dtype.itemsize
      for x, t in zip(jax.tree.leaves(learner), jax.tree.leaves(target)))
  if moves is None:
    moves = not all(
        getattr(t, 'sharding', None) is None or
        x.sharding.is_equivalent_to(t.sharding, x.ndim)
        for x, t in zip(jax.tree.leaves(learner), jax.tree.leaves(target)))
  return narrows or moves or formats is not None


def splits_always(cfg: model_lib.ModelConfig, platform: str) -> bool:
  """Whether the sampler gets a copy of its own on `platform` even where
  nothing else would be copied: on the CPU, for a model with a layer group
  stacked deeper than one, so that it reads each layer's weights as arrays
  of their own (1.05 x a batch-64 generation, 1.3 x at batch 1, the same
  tokens: docs/results/archive/sampler_layer_arrays_cpu_2026-12-05)."""
  return platform == 'cpu' and model_lib.layered(cfg)


def sync_fn(target, formats=None, *, layer_arrays: bool = True):
  """The weight sync as one jitted function of the learner's (params, rest):
  each leaf narrowed to `target`'s dtype where that is narrower (never
  widened) and placed with its sharding (`target`: abstract (params, rest)
  such as `sampler_state`'s; one without shardings, as on one device,
  keeps every leaf's placement), or written in `formats` (`weight_formats`)
  where given.

  With `layer_arrays` (the default) each stacked layer weight is written as
  one array per layer (`model.LayerArrays`, each in its layer's part of the
  sharding and format): the sampler's programs then read a layer's weights
  as a buffer of their own, where a slice of a stacked array is copied
  wherever an operation needs one (on TPU, the MoE layer's conditional:
  Qwen3-30B-A3B's decode step 19.58 -> 14.51 GB of HBM a chip,
  docs/results/archive/plan_decode_bytes_2026-12-05). `sampler_tree` is its output.
  """
  def leaf(x, t):
    if (jnp.issubdtype(x.dtype, jnp.floating) and
        jnp.issubdtype(t.dtype, jnp.floating) and
        x.dtype.itemsize > t.dtype.itemsize):
      return x.astype(t.dtype)
    return x
  shardings = [getattr(t, 'sharding', None) for t in jax.tree.leaves(target)]
  if formats is not None:
    out = formats
  else:
    out = (None if None in shardings else
           jax.tree.map(lambda t: t.sharding, target))
  split = ((lambda t: model_lib.split_layers_like(t, target))
           if layer_arrays else (lambda t: t))
  return jax.jit(lambda tree: split(jax.tree.map(leaf, tree, target)),
                 out_shardings=None if out is None else split(out))


def sampler_tree(target, formats=None, *, layer_arrays: bool = True):
  """What `sync_fn(target, formats, layer_arrays=...)` writes, abstract:
  `target`'s ShapeDtypeStructs in `formats` where given, each stacked layer
  weight as one per layer where `layer_arrays`. What the sampler's programs
  take (the plan compiles them on it)."""
  if formats is not None:
    target = jax.tree.map(
        lambda t, f: jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=f),
        target, formats)
  return model_lib.split_layers(target) if layer_arrays else target


class SamplerWeights:
  """The policy the sampler runs: `model(state)` after each update.

  The sampler's model is the learner's at `param_dtype=dtype` (the leaves
  the model pins, the fp32 router, stay fp32), in the inference layout on a
  mesh (or the learner's, `layout='train'`).

  Args:
    graph: the learner's model graph (`nnx.split(model, nnx.Param, ...)`).
    dtype: `RLConfig.sampler_dtype`.
    ctx: the learner's mesh and rules (None: one device).
    layout: `RLConfig.sampler_layout` ('inference' | 'train').
    weight_layout: `RLConfig.sampler_weight_layout` ('auto' | 'decode' |
      'default'): 'decode' (TPU's 'auto') copies the weights even where
      dtype and placement are the learner's, to lay them out.

  `last_sync_s` is the last sync's seconds (0 when nothing is copied); the
  RL stage logs it as `weight_sync_s`.
  """

  def __init__(self, graph: nnx.GraphDef, dtype: str, *,
               ctx: sharding.ShardingCtx | None = None,
               layout: str = 'inference', weight_layout: str = 'auto'):
    if layout not in SAMPLER_LAYOUTS:
      raise ValueError(f'sampler layout {layout!r} not in {SAMPLER_LAYOUTS}')
    self.graph, self.dtype, self.ctx, self.layout = (graph, jnp.dtype(dtype),
                                                     ctx, layout)
    platform = (jax.devices()[0] if ctx is None else
                ctx.mesh.devices.flat[0]).platform
    self.platform = platform
    self.weight_layout = resolve_weight_layout(weight_layout, platform)
    self.last_sync_s = 0.0
    self._plan = None   # (sampler graph, whether it copies, sync fn)

  def _sync_plan(self, state: train.TrainState):
    if self._plan is None:
      cfg = nnx.merge(self.graph, state.params, state.rest).cfg
      ctx = sampler_ctx(cfg, self.ctx, self.layout)
      graph, params, rest = sampler_state(cfg, self.dtype.name, ctx)
      if ctx is None:   # one device: no placement to change
        params, rest = jax.tree.map(
            lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype),
            (params, rest))
      moves = ctx is not None and not all(
          x.sharding.is_equivalent_to(t.sharding, x.ndim)
          for x, t in zip(jax.tree.leaves((state.params, state.rest)),
                          jax.tree.leaves((params, rest))))
      formats = None
      if self.weight_layout == 'decode':
        # Off a mesh the learner's leaves may be host arrays (a restored
        # state): the sampler's copy goes to the default device.
        formats = weight_formats(
            (params, rest), jax.sharding.SingleDeviceSharding(
                jax.devices()[0]) if ctx is None else None)
      self._plan = (graph if moves else self.graph,
                    splits_always(cfg, self.platform) or copies(
                        (state.params, state.rest), (params, rest), formats,
                        moves=moves),
                    sync_fn((params, rest), formats))
    return self._plan

  def copies(self, state: train.TrainState) -> bool:
    """Whether the sampler needs its own copy (a weight is wider than the
    sampler's model holds it, the sampler's layout differs from the
    learner's, or, on the CPU, some layer group is stacked deeper than one:
    the copy holds each layer's weights as arrays of their own)."""
    return self._sync_plan(state)[1]

  def model(self, state: train.TrainState) -> nnx.Module:
    """The sampler's model: the learner's weights in the sampler's dtype and
    layout (a copy) or, where neither differs, the learner's own."""
    graph, copies, fn = self._sync_plan(state)
    if not copies:
      self.last_sync_s = 0.0
      return nnx.merge(self.graph, state.params, state.rest)
    t0 = time.perf_counter()
    params, rest = jax.block_until_ready(fn((state.params, state.rest)))
    self.last_sync_s = time.perf_counter() - t0
    return nnx.merge(graph, params, rest)
