"""Safetensors files read lazily: headers first, then slices of one tensor at a time.

A checkpoint directory holds `model.safetensors`, or shards named by
`model.safetensors.index.json` (`weight_map`: tensor -> file). `Files`
reads every header (a few KB each) up front, so a missing shard, a tensor
the index names but its file lacks, or an unknown dtype is an error before
any weight is read; `read(name, index)` then reads only the elements of
`index` (a tuple of slices) through a memory map opened for that call, so
the process holds the slice it asked for and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct

import ml_dtypes
import numpy as np

INDEX = 'model.safetensors.index.json'
SINGLE = 'model.safetensors'

DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16,
          'BF16': ml_dtypes.bfloat16, 'I64': np.int64, 'I32': np.int32,
          'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}
FLOAT_DTYPES = ('F64', 'F32', 'F16', 'BF16')


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  file: str              # full path of the file holding it
  dtype: str             # safetensors' name: 'BF16', 'F32', ...
  shape: tuple[int, ...]
  offset: int            # first byte of its data in the file

  @property
  def np_dtype(self):
    return np.dtype(DTYPES[self.dtype])

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.np_dtype.itemsize


def read_header(path: str) -> tuple[dict[str, TensorInfo], dict]:
  """({tensor: TensorInfo}, metadata) of one file, from its header alone."""
  with open(path, 'rb') as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise ValueError(f'{path}: not a safetensors file (shorter than its '
                       'header length)')
    (n,) = struct.unpack('<Q', raw)
    size = os.fstat(f.fileno()).st_size
    if n > size - 8:
      raise ValueError(f'{path}: not a safetensors file (header of {n} bytes '
                       f'in a file of {size})')
    header = json.loads(f.read(n))
  meta = header.pop('__metadata__', {}) or {}
  out = {}
  for name, h in header.items():
    if h['dtype'] not in DTYPES:
      raise ValueError(f'{path}: tensor {name} has dtype {h["dtype"]}, which '
                       f'this reader does not know ({sorted(DTYPES)})')
    start, stop = h['data_offsets']
    info = TensorInfo(path, h['dtype'], tuple(h['shape']), 8 + n + start)
    if stop - start != info.nbytes or 8 + n + stop > size:
      raise ValueError(f'{path}: tensor {name} ({h["dtype"]} {info.shape}) '
                       f'does not fit its data offsets {start}..{stop} '
                       '(a truncated or corrupt file)')
    out[name] = info
  return out, meta


class Files:
  """Every tensor of a checkpoint directory, by name, read lazily."""

  def __init__(self, path: str):
    self.path = path
    index = os.path.join(path, INDEX)
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)['weight_map']
      files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(path, SINGLE)):
      weight_map, files = None, [SINGLE]
    else:
      raise FileNotFoundError(f'{path}: no {SINGLE} and no {INDEX}')
    self.tensors: dict[str, TensorInfo] = {}
    for name in files:
      full = os.path.join(path, name)
      if not os.path.exists(full):
        raise FileNotFoundError(f'{path}: {INDEX} names the weights file '
                                f'{name}, which is missing')
      found, _ = read_header(full)
      self.tensors.update(found)
    if weight_map is not None:
      for t, name in sorted(weight_map.items()):
        info = self.tensors.get(t)
        if info is None or os.path.basename(info.file) != name:
          raise ValueError(f'{path}: {INDEX} places tensor {t} in {name}, '
                           'which does not hold it')

  def __contains__(self, name: str) -> bool:
    return name in self.tensors

  def __getitem__(self, name: str) -> TensorInfo:
    return self.tensors[name]

  def keys(self):
    return self.tensors.keys()

  @property
  def nbytes(self) -> int:
    return sum(t.nbytes for t in self.tensors.values())

  def read(self, name: str, index: tuple = ()) -> np.ndarray:
    """Tensor `name`'s elements at `index` (slices / ints), as a new array."""
    t = self.tensors[name]
    mm = np.memmap(t.file, dtype=t.np_dtype, mode='r', offset=t.offset,
                   shape=t.shape)
    try:
      return np.array(mm[index])
    finally:
      del mm


NAMES = {np.dtype(v).name: k for k, v in DTYPES.items()}


class Writer:
  """One safetensors file written a tensor at a time: the header (names,
  dtypes, shapes: all known up front) first, then each tensor's bytes in
  the header's order, so only the tensor being written is in memory."""

  def __init__(self, path: str, tensors: list[tuple[str, np.dtype, tuple]],
               metadata: dict | None = None):
    header, at = {}, 0
    for name, dtype, shape in tensors:
      n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
      header[name] = dict(dtype=NAMES[np.dtype(dtype).name],
                          shape=list(shape), data_offsets=[at, at + n])
      at += n
    if metadata:
      header['__metadata__'] = {k: str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(',', ':')).encode()
    raw += b' ' * (-len(raw) % 8)          # the data starts 8-byte aligned
    self.path, self._order = path, [t[0] for t in tensors]
    self._specs = {t[0]: (np.dtype(t[1]), tuple(t[2])) for t in tensors}
    self._tmp = path + '.tmp'
    self._f = open(self._tmp, 'wb')
    self._f.write(struct.pack('<Q', len(raw)) + raw)
    self._next = 0

  def write(self, name: str, value: np.ndarray) -> None:
    if self._next >= len(self._order) or self._order[self._next] != name:
      raise ValueError(f'{self.path}: {name} written out of the header\'s '
                       'order')
    dtype, shape = self._specs[name]
    value = np.ascontiguousarray(value)
    if value.dtype != dtype or value.shape != shape:
      raise ValueError(f'{self.path}: {name} is {value.dtype} {value.shape}, '
                       f'the header says {dtype} {shape}')
    self._f.write(value.tobytes())
    self._next += 1

  def close(self) -> None:
    self._f.close()
    if self._next != len(self._order):
      os.remove(self._tmp)
      raise ValueError(f'{self.path}: {len(self._order) - self._next} '
                       'tensors were never written')
    os.replace(self._tmp, self.path)
