"""Shardings for NNX model state from the `logical_axes` metadata of its variables."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from cascade_jax.sharding._rules import ShardingCtx


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def _axes(v: nnx.Variable) -> tuple:
  axes = v.get_metadata().get('logical_axes')
  if axes is None:
    raise ValueError(
        f'variable {type(v).__name__} of shape {v.shape} was created without '
        'logical_axes; every parameter must name its axes')
  return tuple(axes)


def logical_axes_of(state: nnx.State):
  """The `logical_axes` of every variable in `state` (a pytree of tuples)."""
  return jax.tree.map(_axes, state, is_leaf=_is_var)


def state_shardings(ctx: ShardingCtx, state: nnx.State) -> nnx.State:
  """`state` with every variable's value replaced by its NamedSharding.

  The result has the structure of `state`, so it serves as `in_shardings` /
  `out_shardings` of a jit, or in `with_sharding_constraint`, as it is.
  """
  return jax.tree.map(lambda v: v.replace(ctx.sharding(_axes(v), v.shape)),
                      state, is_leaf=_is_var)


def put(x, sharding: NamedSharding) -> jax.Array:
  """device_put that also works on multi-process meshes.

  Where the mesh spans other processes, every process must pass the same
  full value; each one places the shards on its own devices.
  """
  if sharding.is_fully_addressable:
    return jax.device_put(x, sharding)
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def shard_model(model: nnx.Module, ctx: ShardingCtx) -> nnx.Module:
  """Places every variable of `model` (in place) according to the rules."""
  state = nnx.state(model)
  placed = jax.tree.map(put, state, state_shardings(ctx, state))
  nnx.update(model, placed)
  return model


def to_host(tree):
  """numpy values of a pytree of arrays, on every process.

  `jax.device_get` refuses arrays that span other processes' devices; those
  are gathered (replicated ones read from a local copy).
  """
  def get(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(x)
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree.map(get, tree)


def abstract_state(ctx: ShardingCtx | None, state: nnx.State) -> nnx.State:
  """`state` (e.g. of `nnx.eval_shape`) as ShapeDtypeStructs with the
  shardings of the rules: what a checkpoint restores straight into, on
  every device at once, without first building the weights."""
  def leaf(v):
    sh = None if ctx is None else ctx.sharding(_axes(v), v.shape)
    return v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh))
  return jax.tree.map(leaf, state, is_leaf=_is_var)
