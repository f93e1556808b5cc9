"""One process's part of a weight that spans several processes, as host arrays (`Shards`), and the blocks a sampler cuts from it."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


@dataclasses.dataclass
class Shards:
  """One process's part of a global array that spans several processes:
  its distinct shards by their index (`index_key`), as host arrays. The
  sampler process on the same host places them on its own devices
  (`place`), each of its blocks cut from those that cover it: its mesh
  may differ from the learner's (other devices, another shape) as long as
  each of its blocks lies in what this host's learner devices hold."""
  shape: tuple[int, ...]
  dtype: np.dtype
  blocks: dict[tuple, np.ndarray]

  @classmethod
  def local(cls, x: jax.Array) -> Shards:
    blocks = {}
    for s in x.addressable_shards:   # a replicated block once
      key = index_key(s.index, x.shape)
      if key not in blocks:
        blocks[key] = np.asarray(s.data)
    return cls(tuple(x.shape), np.dtype(x.dtype), blocks)

  def place(self, sharding: jax.sharding.Sharding) -> jax.Array:
    """This process's part on `sharding`'s devices of this process."""
    return jax.make_array_from_callback(
        self.shape, sharding, lambda index: self.block(index_key(
            index, self.shape)))

  def block(self, want: tuple) -> np.ndarray:
    """The block at `want` ((start, stop) a dimension) from the shards
    that overlap it (distinct shards of one sharding do not overlap)."""
    if want in self.blocks:
      return self.blocks[want]
    out = np.empty([b - a for a, b in want], self.dtype)
    filled = 0
    for key, data in self.blocks.items():
      lo = [max(a, c) for (a, _), (c, _) in zip(want, key)]
      hi = [min(b, d) for (_, b), (_, d) in zip(want, key)]
      if any(l >= h for l, h in zip(lo, hi)):
        continue
      out[tuple(slice(l - a, h - a) for l, h, (a, _) in zip(lo, hi, want))] = (
          data[tuple(slice(l - c, h - c)
                     for l, h, (c, _) in zip(lo, hi, key))])
      filled += int(np.prod([h - l for l, h in zip(lo, hi)]))
    if filled != out.size:
      raise ValueError(
          f'rl: the sampler process needs block {want} of a {self.shape} '
          "weight, which its learner process's devices do not hold "
          f'(they hold {sorted(self.blocks)}): on several hosts each '
          "host's sampler devices must need only what its learner devices "
          "hold (rl.rollout_mesh; a mirror of the learner's mesh does)")
    return out


def index_key(index: tuple, shape: tuple[int, ...]) -> tuple:
  """A shard's index (slices) as ((start, stop), ...) per dimension."""
  return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
