"""Hugging Face weights streamed into a sharded model: each device's slice read from disk.

An architecture's mapping (`_hf_qwen3`, `_hf_nemotron_h`) says, for every
variable of our model, which Hugging Face tensor(s) it is made of, as data:
a `Piece` is one tensor (or a row range of a fused one) whose dimensions
are transposed and split into ours (`w.T.reshape(...)` as a layout, not a
function), so the elements one device holds map back to a box of the file.
Per-layer variables are stacked (`Transformer.layers`, a leading `layers`
axis per unit position), and expert weights stored one tensor per expert
stack on an expert axis: a `Source` is the array of Pieces over those
leading axes.

`load` checks every tensor's presence, shape and dtype against the model
before any device memory is touched, then builds each variable from its
devices' slices: every process reads only the slices its own devices hold,
and holds no more than one device's slice on the host at a time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from cascade_jax.checkpoint._safetensors import FLOAT_DTYPES
from cascade_jax.checkpoint._safetensors import Files
from cascade_jax.checkpoint._safetensors import INDEX
from cascade_jax.checkpoint._safetensors import Writer


@dataclasses.dataclass(frozen=True)
class Piece:
  """Our array (or its part) as a layout of one Hugging Face tensor.

  The tensor (expected shape `hf_shape`) has `squeeze` (an axis of size 1)
  dropped and only `rows` of its axis 0 taken (a part of a fused tensor);
  its axis h then becomes our dims `groups[h]` (a split: row-major, so
  their product is the axis' length), and our dims come in the order of
  the axes `perm`. E.g. a torch linear [out, in] whose out is heads x
  head_dim: groups ((n, h), (d,)), perm (1, 0) is ours [d, n, h].
  """
  key: str
  hf_shape: tuple[int, ...]
  groups: tuple[tuple[int, ...], ...]
  perm: tuple[int, ...]
  rows: tuple[int, int] | None = None
  squeeze: int | None = None

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(s for h in self.perm for s in self.groups[h])

  def read(self, files: Files, index: tuple[slice, ...]) -> np.ndarray:
    """Our elements at `index` (slices of `self.shape`), read from disk."""
    mine, at = {}, 0
    for h in self.perm:
      mine[h] = index[at:at + len(self.groups[h])]
      at += len(self.groups[h])
    hf_index, shapes, subs = [], [], {}
    for h, sizes in enumerate(self.groups):
      spans = [s.indices(n)[:2] for s, n in zip(mine[h], sizes)]
      inner = math.prod(sizes[1:])
      lo, hi = spans[0][0] * inner, spans[0][1] * inner
      if h == 0 and self.rows is not None:
        lo, hi = lo + self.rows[0], hi + self.rows[0]
      hf_index.append(slice(lo, hi))
      shapes += [spans[0][1] - spans[0][0], *sizes[1:]]
      subs[h] = [slice(None)] + [slice(a, b) for a, b in spans[1:]]
    if self.squeeze is not None:
      hf_index.insert(self.squeeze, 0)
    block = files.read(self.key, tuple(hf_index)).reshape(shapes)
    # Axes of the block grouped per HF dim, then put in our order.
    starts = np.cumsum([0] + [len(g) for g in self.groups])
    order = [a for h in self.perm for a in range(starts[h], starts[h + 1])]
    block = block.transpose(order)
    return block[tuple(s for h in self.perm for s in subs[h])]


  def to_hf(self, ours: np.ndarray) -> np.ndarray:
    """The inverse of `read`: our whole array (`self.shape`) as this
    Piece's part of the tensor (its `rows`, with `squeeze` put back)."""
    pos, at = {}, 0
    for h in self.perm:
      pos[h] = list(range(at, at + len(self.groups[h])))
      at += len(self.groups[h])
    x = ours.transpose([a for h in range(len(self.groups)) for a in pos[h]])
    x = x.reshape([math.prod(g) for g in self.groups])
    return x if self.squeeze is None else np.expand_dims(x, self.squeeze)


def linear(key: str, out: tuple[int, ...], in_: tuple[int, ...], *,
           rows: tuple[int, int] | None = None, total: int | None = None
           ) -> Piece:
  """A torch linear [out, in] as ours [*in, *out] (`w.T`, split)."""
  n_out = math.prod(out)
  hf_out = total if rows is not None else n_out
  return Piece(key, (hf_out, math.prod(in_)), (out, in_), (1, 0), rows)


def same(key: str, shape: tuple[int, ...], ours: tuple[int, ...] | None = None
         ) -> Piece:
  """A tensor taken as it is (`ours`: a row-major reshape of a 1-D one)."""
  if ours is not None:
    return Piece(key, shape, (ours,), (0,))
  return Piece(key, shape, tuple((n,) for n in shape), tuple(range(len(shape))))


@dataclasses.dataclass
class Source:
  """A variable as Pieces over its leading axes (layers, experts): an object
  array of shape `lead`, every Piece of the same shape."""
  pieces: np.ndarray

  @property
  def shape(self) -> tuple[int, ...]:
    return self.pieces.shape + self.pieces.flat[0].shape

  def read(self, files: Files, index: tuple[slice, ...]) -> np.ndarray:
    lead = self.pieces.ndim
    index = tuple(index) + (slice(None),) * (len(self.shape) - len(index))
    sub = self.pieces[index[:lead]]
    if not isinstance(sub, np.ndarray):     # no leading axes
      return sub.read(files, index)
    parts = [p.read(files, index[lead:]) for p in sub.flat]
    return np.stack(parts).reshape(sub.shape + parts[0].shape)


def source(p: Piece | list[Piece]) -> Source:
  arr = np.empty(len(p) if isinstance(p, list) else (), dtype=object)
  if isinstance(p, list):
    for i, x in enumerate(p):
      arr[i] = x
  else:
    arr[()] = p
  return Source(arr)


def stacked_sources(cfg, top: dict[tuple, Any],
                    layer: Callable[[int, str], dict[tuple, Any]]
                    ) -> dict[tuple, Source]:
  """{our variable path: Source} for the stacked model (`Transformer.layers`).

  `top`: {path: Piece} of the variables outside the layers; `layer(i,
  kind)`: {path within the Block: Piece, or a list of Pieces over experts}.
  """
  out = {k: source(v) for k, v in top.items()}
  per_layer = [layer(i, kind) for i, kind in enumerate(cfg.pattern)]
  first = 0
  for g, (unit, repeats) in enumerate(cfg.layer_groups):
    p = len(unit)
    for j in range(p):
      mine = [per_layer[first + k * p + j] for k in range(repeats)]
      for sub in mine[0]:
        parts = [source(m[sub]).pieces for m in mine]
        out[('layers', g, 'blocks', j) + sub] = Source(np.stack(parts))
    first += p * repeats
  return out


def check(files: Files, sources: dict[tuple, Source], model_shapes: dict,
          *, ignored: Callable[[str], bool] = lambda k: False) -> None:
  """Every Piece's tensor present, of its shape and a float dtype; every
  tensor of the files used (or `ignored`); every model variable covered.
  Errors name the file and tensor, before anything is read."""
  missing, wrong, used = [], [], set()
  for path, src in sources.items():
    want = model_shapes.get(path)
    if want is None:
      raise ValueError(f'{files.path}: the mapping names {path}, which the '
                       'model does not have')
    if tuple(want) != src.shape:
      raise ValueError(f'{files.path}: {"/".join(map(str, path))} would be '
                       f'{src.shape} from the checkpoint, the model has '
                       f'{tuple(want)}')
    for p in src.pieces.flat:
      if p.key not in files:
        missing.append(p.key)
        continue
      used.add(p.key)
      t = files[p.key]
      if t.shape != p.hf_shape:
        wrong.append(f'{t.file}: {p.key} has shape {t.shape}, the config '
                     f'needs {p.hf_shape}')
      elif t.dtype not in FLOAT_DTYPES:
        wrong.append(f'{t.file}: {p.key} has dtype {t.dtype}, not a float')
  if missing:
    raise ValueError(f'{files.path}: checkpoint lacks {len(missing)} weights '
                     f'the model needs, e.g. {sorted(set(missing))[:5]}')
  if wrong:
    raise ValueError(f'{files.path}: {len(wrong)} tensors do not fit the '
                     'model: ' + '; '.join(wrong[:5]))
  unused = sorted(k for k in files.keys() if k not in used and not ignored(k))
  if unused:
    raise ValueError(f'{files.path}: {len(unused)} tensors do not fit the '
                     f'model, e.g. {unused[:5]}')
  uncovered = sorted('/'.join(map(str, p)) for p in model_shapes
                     if p not in sources)
  if uncovered:
    raise ValueError(f'{files.path}: nothing in the checkpoint fills '
                     f'{uncovered[:5]}')


_is_var = lambda x: isinstance(x, nnx.Variable)


def _variables(state) -> tuple[dict[tuple, nnx.Variable], Any]:
  """({variable path as a tuple of keys: Variable}, the state's treedef)."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_var)
  return {tuple(getattr(e, 'key', getattr(e, 'idx', e)) for e in p): v
          for p, v in flat}, treedef


def load(files: Files, sources: dict[tuple, Source], model: nnx.Module, *,
         ignored: Callable[[str], bool] = lambda k: False) -> nnx.Module:
  """`model` (abstract: ShapeDtypeStructs, sharded or not) filled from disk.

  Each variable is made on its sharding (one device's on a single device)
  from its devices' slices, each read from the files, cast to the
  variable's dtype and placed before the next is read.
  """
  graph, state = nnx.split(model)
  leaves, treedef = _variables(state)
  check(files, sources, {k: v.shape for k, v in leaves.items()},
        ignored=ignored)
  device = jax.devices()[0]

  def make(var: nnx.Variable, src: Source):
    value = var.get_value()
    sharding = (value.sharding if getattr(value, 'sharding', None) is not None
                else jax.sharding.SingleDeviceSharding(device))
    dtype, shape = np.dtype(value.dtype), tuple(value.shape)
    # One device's slice at a time, on its device before the next is read
    # (`make_array_from_callback` would hold every local slice on the host
    # at once: a whole stacked variable for a process of 8 devices).
    shards = []
    for dev, idx in sharding.addressable_devices_indices_map(shape).items():
      shards.append(jax.device_put(src.read(files, idx).astype(dtype), dev))
    return var.replace(
        jax.make_array_from_single_device_arrays(shape, sharding, shards))

  filled = [make(var, sources[path]) for path, var in leaves.items()]
  return nnx.merge(graph, jax.tree_util.tree_unflatten(treedef, filled))


def _natural(name: str):
  """'model.layers.10.x' after 'model.layers.9.x': numbers compare as numbers."""
  return [(0, int(t), '') if t.isdigit() else (1, 0, t)
          for t in name.replace('_', '.').split('.')]


@jax.jit
def _take(a: jax.Array, lead: tuple) -> jax.Array:
  """a[lead] (leading indices) as one dynamic slice: a copy of the slice
  alone (indexing with traced ints would be a gather)."""
  k = len(lead)
  out = jax.lax.dynamic_slice(a, tuple(lead) + (0,) * (a.ndim - k),
                              (1,) * k + a.shape[k:])
  return out.reshape(a.shape[k:])


def save(sources: dict[tuple, Source], model: nnx.Module, path: str, *,
         dtype, max_shard_bytes: int = 4 << 30,
         aliases: dict[str, str] | None = None) -> list[str]:
  """Writes `model`'s weights as the Hugging Face tensors `sources` map
  them from: safetensors shards of at most `max_shard_bytes` (and an index
  when there are several) in `dtype`. Each tensor is taken from the
  devices (a jitted slice of one layer / expert), written, and dropped:
  host memory holds about one tensor. `aliases`: tensors written again
  under another name (a tied output head). Returns the files written."""
  arrays = {k: v.get_value() for k, v in _variables(nnx.state(model))[0].items()}
  parts: dict[str, list] = {}
  for ours, src in sources.items():
    for lead in np.ndindex(src.pieces.shape):
      piece = src.pieces[lead]
      parts.setdefault(piece.key, []).append((ours, lead, piece))
  for alias, key in (aliases or {}).items():   # e.g. a tied lm_head
    parts[alias] = parts[key]
  names = sorted(parts, key=_natural)
  dtype = np.dtype(dtype)
  shards, size = [[]], 0
  for name in names:
    n = math.prod(parts[name][0][2].hf_shape) * dtype.itemsize
    if shards[-1] and size + n > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += n
  files = (['model.safetensors'] if len(shards) == 1 else
           [f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
            for i in range(len(shards))])
  for file, keys in zip(files, shards):
    w = Writer(os.path.join(path, file),
               [(k, dtype, parts[k][0][2].hf_shape) for k in keys],
               metadata={'format': 'pt'})
    for k in keys:
      out = None
      for ours, lead, piece in parts[k]:
        a = arrays[ours]
        if not lead or isinstance(a, np.ndarray):   # host arrays: a view
          v = a[lead]
        else:
          v = _take(a, tuple(np.int32(i) for i in lead))
        part = piece.to_hf(np.asarray(jax.device_get(v)).astype(dtype))
        if piece.rows is None:
          out = part
        else:        # a part of a fused tensor
          if out is None:
            out = np.zeros(piece.hf_shape, dtype)
          out[piece.rows[0]:piece.rows[1]] = part
      w.write(k, out)
    w.close()
  if len(files) > 1:
    weight_map = {k: f for f, keys in zip(files, shards) for k in keys}
    total = sum(math.prod(parts[k][0][2].hf_shape) for k in names)
    with open(os.path.join(path, INDEX), 'w') as f:
      json.dump(dict(metadata=dict(total_size=int(total * dtype.itemsize)),
                     weight_map=weight_map), f, indent=2)
  return files
