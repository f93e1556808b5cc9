"""Shardings for NNX model state from the `logical_axes` metadata of its variables."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

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

  One explicit transfer (`jax.device_get` of the whole tree), so it passes
  `jax.transfer_guard('disallow')`. `jax.device_get` refuses arrays that
  span other processes' devices; those are gathered (replicated ones read
  from a local copy).
  """
  def get(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return x
    if x.is_fully_replicated:
      return x.addressable_data(0)
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return multihost_utils.process_allgather(x, tiled=True)
  return jax.tree.map(np.asarray, jax.device_get(jax.tree.map(get, tree)))


def pad_rows(tree, multiple: int):
  """(tree with every leaf's rows padded to a multiple of `multiple`, rows before).

  Leaves are [B, ...] (numpy or jax) with the same B, or `tree` is a list
  of rows (e.g. token lists); the padding repeats the last row. The one way
  rows are padded to the devices a batch is split over
  (`ShardingCtx.shards('batch')`): a copy computes what its row does, and
  the caller drops the padding (`x[:rows]`).
  """
  if isinstance(tree, list):
    return tree + tree[-1:] * (-len(tree) % max(multiple, 1)), len(tree)
  leaves = jax.tree.leaves(tree)
  rows = leaves[0].shape[0] if leaves else 0
  pad = -rows % max(multiple, 1)
  if not pad:
    return tree, rows
  xp = lambda x: jax.numpy if isinstance(x, jax.Array) else np
  return jax.tree.map(lambda x: xp(x).concatenate(
      [x, xp(x).repeat(x[-1:], pad, axis=0)]), tree), rows


def constrain_rows(ctx: ShardingCtx | None, tree):
  """In a jitted function: `tree` with every leaf's rows (axis 0) split over
  the 'batch' rule's mesh axes, its other axes left to the compiler (a KV
  cache's heads follow the attention's split over 'tensor'); unchanged
  without a mesh. It pins a sampler's per-row state (KV cache, tokens,
  keys) to the devices that decode those rows. A row count the axes do not
  divide stays replicated."""
  if ctx is None:
    return tree
  axes = ctx.mesh_axes('batch')
  shards = ctx.shards('batch')

  def pin(x):
    if not x.ndim:
      return x
    rows = (None if not axes or x.shape[0] % shards else
            axes[0] if len(axes) == 1 else axes)
    spec = P(rows, *[P.UNCONSTRAINED] * (x.ndim - 1))
    return jax.lax.with_sharding_constraint(x, NamedSharding(ctx.mesh, spec))
  return jax.tree.map(pin, tree)


def abstract_state(ctx: ShardingCtx | None, state: nnx.State) -> nnx.State:
  """`state` (e.g. of `nnx.eval_shape`) as ShapeDtypeStructs with the
  shardings of the rules: what a checkpoint restores straight into, on
  every device at once, without first building the weights."""
  def leaf(v):
    sh = None if ctx is None else ctx.sharding(_axes(v), v.shape)
    return v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh))
  return jax.tree.map(leaf, state, is_leaf=_is_var)
