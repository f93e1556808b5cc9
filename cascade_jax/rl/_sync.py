"""The weight sync: the sampler's copy of the policy, made from the learner's state after each update.

The learner keeps fp32 master weights; a sampler at scale reads bf16
(`RLConfig.sampler_dtype`): half the bytes each decode step streams. The
copy is one jitted cast of the train state's parameters, each leaf keeping
its sharding (the rules' layout on the stage's mesh), so no weight crosses
the host. Weights already no wider than `sampler_dtype` are read as they
are: with the main job's fp32 weights and 'float32' nothing is copied and
sampling stays exactly on-policy.

Not here yet (issue 31): a separate inference layout (experts over the
expert axis alone, no FSDP gathers in decode) and a sampler on its own
devices or process, to which this copy would be sent.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
from flax import nnx

from cascade_jax import train


@functools.partial(jax.jit, static_argnames='dtype')
def cast_weights(params, *, dtype: str):
  """Every float leaf wider than `dtype` cast to it; shardings kept."""
  def leaf(x):
    if (jnp.issubdtype(x.dtype, jnp.floating) and
        x.dtype.itemsize > jnp.dtype(dtype).itemsize):
      return x.astype(dtype)
    return x
  return jax.tree.map(leaf, params)


class SamplerWeights:
  """The policy the sampler runs: `model(state)` after each update.

  `last_sync_s` is the last sync's seconds (0 when nothing is copied); the
  RL stage logs it as `weight_sync_s`.
  """

  def __init__(self, graph: nnx.GraphDef, dtype: str):
    self.graph, self.dtype = graph, jnp.dtype(dtype)
    self.last_sync_s = 0.0

  def copies(self, state: train.TrainState) -> bool:
    """Whether the sampler needs its own copy (some weight is wider)."""
    return any(jnp.issubdtype(x.dtype, jnp.floating) and
               x.dtype.itemsize > self.dtype.itemsize
               for x in jax.tree.leaves(state.params))

  def model(self, state: train.TrainState) -> nnx.Module:
    """The sampler's model: the learner's weights in `dtype` (a copy on the
    same devices and shardings) or, when they are no wider, the learner's
    own."""
    if not self.copies(state):
      self.last_sync_s = 0.0
      return nnx.merge(self.graph, state.params, state.rest)
    t0 = time.perf_counter()
    params = jax.block_until_ready(
        cast_weights(state.params, dtype=self.dtype.name))
    self.last_sync_s = time.perf_counter() - t0
    return nnx.merge(self.graph, params, state.rest)
