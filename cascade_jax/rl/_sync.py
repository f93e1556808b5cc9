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
reshard together), so no weight crosses the host. Where neither differs
(the main job: fp32 on one device) nothing is copied and the sampler reads
the learner's own arrays, exactly on-policy. A reshard alone is exact too:
the loss corrects only for the dtype (`RLConfig.correction`).

A sampler in a process of its own (`rl.rollout_worker='process'`,
`rl._decoupled`) is sent this copy as host arrays after each update.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import model as model_lib
from cascade_jax import sharding
from cascade_jax import train


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


def sync_fn(target):
  """The weight sync as one jitted function of the learner's (params, rest):
  each leaf narrowed to `target`'s dtype where that is narrower (never
  widened) and placed with its sharding (`target`: abstract (params, rest)
  such as `sampler_state`'s; one without shardings, as on one device,
  keeps every leaf's placement)."""
  def leaf(x, t):
    if (jnp.issubdtype(x.dtype, jnp.floating) and
        jnp.issubdtype(t.dtype, jnp.floating) and
        x.dtype.itemsize > t.dtype.itemsize):
      return x.astype(t.dtype)
    return x
  shardings = [getattr(t, 'sharding', None) for t in jax.tree.leaves(target)]
  return jax.jit(lambda tree: jax.tree.map(leaf, tree, target),
                 out_shardings=(None if None in shardings else jax.tree.map(
                     lambda t: t.sharding, target)))


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

  `last_sync_s` is the last sync's seconds (0 when nothing is copied); the
  RL stage logs it as `weight_sync_s`.
  """

  def __init__(self, graph: nnx.GraphDef, dtype: str, *,
               ctx: sharding.ShardingCtx | None = None,
               layout: str = 'inference'):
    if layout not in ('inference', 'train'):
      raise ValueError(f"sampler layout {layout!r} not in ('inference', "
                       "'train')")
    self.graph, self.dtype, self.ctx, self.layout = (graph, jnp.dtype(dtype),
                                                     ctx, layout)
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
      narrows = any(
          jnp.issubdtype(x.dtype, jnp.floating) and
          x.dtype.itemsize > t.dtype.itemsize
          for x, t in zip(jax.tree.leaves(state.params),
                          jax.tree.leaves(params)))
      moves = ctx is not None and not all(
          x.sharding.is_equivalent_to(t.sharding, x.ndim)
          for x, t in zip(jax.tree.leaves((state.params, state.rest)),
                          jax.tree.leaves((params, rest))))
      self._plan = (graph if moves else self.graph, narrows or moves,
                    sync_fn((params, rest)))
    return self._plan

  def copies(self, state: train.TrainState) -> bool:
    """Whether the sampler needs its own copy (a weight is wider than the
    sampler's model holds it, or the sampler's layout differs from the
    learner's)."""
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
