"""A stacked weight held as one array per layer: the sampler's copy of the model.

The model stores each `Stack`'s weights stacked on a leading 'layers' axis
([L, ...]): what `lax.scan` and the optimizer want. A program that reads a
layer's slice of a stacked array and hands it to an operation that needs a
buffer of its own (on TPU, an operand of the MoE layer's `lax.cond`) copies
it, every call: Qwen3-30B-A3B's compiled decode step (v5p-64) accessed
19.58 GB of HBM a chip against 12.97 GB of arguments, 14.51 GB with the
weights passed one array per layer (docs/results/archive/plan_decode_bytes_2026-12-05).

`LayerArrays` is that layout as a value a variable can hold in place of its
[L, ...] array: a pytree of L arrays (or ShapeDtypeStructs, shardings,
formats: whatever a tree of the model's values holds). `Stack.layer(j, k)`,
which is how the sampler reads layers, takes array k itself;
`Transformer.__call__` takes layer k of each the same way, and stacks them
again (once, in the program) only to scan. The weight sync
(`rl.SamplerWeights`) writes the sampler's copy so (`split_layers`).
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental.layout import Format
from jax.experimental.layout import Layout
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec


@jax.tree_util.register_pytree_node_class
class LayerArrays:
  """A [L, ...] weight as L values of its own, read a layer at a time.

  `x[k]` is layer k's value; `shape` / `dtype` / `ndim` describe the
  stacked weight (as the variable's logical axes do); `stacked()` is the
  [L, ...] array (a copy: for a scan, inside a program).
  """

  def __init__(self, parts: Iterable):
    self.parts = tuple(parts)
    if not self.parts:
      raise ValueError('LayerArrays: no layers')

  def __getitem__(self, k):
    if not isinstance(k, (int, np.integer)):
      raise TypeError(
          f'LayerArrays is read a layer at a time (an int index), got {k!r}: '
          'stack it (model.stack_layers) to read the [L, ...] weight')
    return self.parts[k]

  def __len__(self) -> int:
    return len(self.parts)

  @property
  def shape(self) -> tuple[int, ...]:
    return (len(self.parts),) + tuple(self.parts[0].shape)

  @property
  def dtype(self):
    return self.parts[0].dtype

  @property
  def ndim(self) -> int:
    return 1 + len(self.parts[0].shape)

  def stacked(self) -> jax.Array:
    return jnp.stack(self.parts)

  def __repr__(self) -> str:
    return f'LayerArrays({len(self.parts)} x {self.parts[0]!r})'

  def tree_flatten(self):
    return self.parts, None

  @classmethod
  def tree_unflatten(cls, _, parts):
    return cls(parts)


def is_layered(v) -> bool:
  """Whether `v` is a variable stacked on a leading 'layers' axis (a `Stack`'s)."""
  if not isinstance(v, nnx.Variable):
    return False
  axes = v.get_metadata().get('logical_axes') or ()
  return bool(axes) and axes[0] == 'layers'


def _drop_sharding(s, what: str):
  """`s` (a sharding) of the stacked value as its layer part's."""
  if isinstance(s, NamedSharding):
    spec = tuple(s.spec)
    if spec and spec[0] is not None:
      raise ValueError(f'{what}: split over its layers axis ({s.spec}); a '
                       'layer at a time needs each layer whole on its devices')
    return NamedSharding(s.mesh, PartitionSpec(*spec[1:]),
                         memory_kind=s.memory_kind)
  return s   # SingleDeviceSharding and the like: the same for a part


def _drop_layout(layout: Layout | None, ndim: int):
  if layout is None or not isinstance(layout, Layout):
    return layout
  order = [d - 1 for d in layout.major_to_minor if d != 0]
  if len(order) != ndim - 1:
    raise ValueError(f'a layout of {ndim} dims: {layout}')
  return Layout(major_to_minor=tuple(order), tiling=layout.tiling,
                sub_byte_element_size_in_bits=(
                    layout.sub_byte_element_size_in_bits))


def layer_part(x, k: int, ndim: int, what: str = 'a weight'):
  """Layer k's part of a stacked weight's value `x` (an array, a
  ShapeDtypeStruct, a sharding or a `Format` of a [L, ...] weight of `ndim`
  dims)."""
  if x is None:
    return None
  if isinstance(x, jax.ShapeDtypeStruct):
    fmt = getattr(x, 'format', None)
    s = (layer_part(fmt, k, ndim, what)
         if isinstance(fmt, Format) and fmt.layout is not None
         else layer_part(x.sharding, k, ndim, what))
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=s,
                                weak_type=x.weak_type)
  if isinstance(x, Format):
    return Format(_drop_layout(x.layout, ndim),
                  None if x.sharding is None else
                  _drop_sharding(x.sharding, what))
  if isinstance(x, jax.sharding.Sharding):
    return _drop_sharding(x, what)
  return x[k]


def split_layers(tree):
  """`tree` (a model's State, or a pytree of States, of arrays or
  ShapeDtypeStructs) with each stacked variable's value as `LayerArrays` of
  its layers' parts (`layer_part`); values split already stay as they are.
  A tree of shardings or formats (no shapes of their own) splits by the
  values it describes: `split_layers_like`."""
  return split_layers_like(tree, tree)


def split_layers_like(tree, like):
  """`tree` (values, shardings or formats in the structure of `like`, a
  State) split where `split_layers(like)` splits `like`: by `like`'s
  variables' axes and shapes."""
  def split(v, t):
    if not is_layered(t):
      return v
    x = v.get_value() if isinstance(v, nnx.Variable) else v
    if isinstance(x, LayerArrays) or x is None:
      return v
    shape = getattr(t.get_value(), 'shape', None)
    if shape is None:   # a sharding or a format: no shape of its own
      raise ValueError(f'split_layers: the layer count of {x!r} is not known'
                       ' (split by the values: split_layers_like)')
    parts = LayerArrays(layer_part(x, k, len(shape)) for k in range(shape[0]))
    return v.replace(parts) if isinstance(v, nnx.Variable) else parts
  return jax.tree.map(split, tree, like,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def stack_layers(tree):
  """`split_layers`' inverse: each `LayerArrays` value stacked into its
  [L, ...] array (a copy)."""
  def stack(v):
    if is_layered(v) and isinstance(v.get_value(), LayerArrays):
      return v.replace(v.get_value().stacked())
    return v
  return jax.tree.map(stack, tree, is_leaf=is_layered)


_split_state = jax.jit(lambda state: split_layers(state))  # pylint: disable=unnecessary-lambda


def layered(cfg) -> bool:
  """Whether a model of `cfg` stacks some layer group deeper than one
  (a [1, ...] weight's layer is the array itself, reshaped: nothing to split)."""
  return any(repeats > 1 for _, repeats in cfg.layer_groups)


def split_model(model):
  """`model`'s weights with each stacked layer weight copied into one array
  per layer (one jitted copy, placed as the stacked weights are): for the
  sampler's programs, which read a layer at a time. A model with nothing
  deeper than one layer a group comes back as it is."""
  if not layered(model.cfg):
    return model
  graph, state = nnx.split(model)
  return nnx.merge(graph, _split_state(state))


def has_layer_arrays(tree) -> bool:
  """Whether any variable of `tree` holds `LayerArrays`."""
  return any(isinstance(v.get_value(), LayerArrays)
             for v in jax.tree.leaves(tree, is_leaf=is_layered)
             if is_layered(v))


__all__ = ['has_layer_arrays', 'is_layered', 'layer_part', 'LayerArrays',
           'layered', 'split_layers', 'split_layers_like', 'split_model',
           'stack_layers']
