"""Hugging Face checkpoints by architecture: config.json's `model_type` picks the mapping."""

from __future__ import annotations

import collections

import numpy as np

from cascade_jax.checkpoint import _hf_nemotron_h
from cascade_jax.checkpoint import _hf_qwen3
from cascade_jax.checkpoint._hf_qwen3 import read_config
from cascade_jax.checkpoint._safetensors import DTYPES
from cascade_jax.checkpoint._safetensors import FLOAT_DTYPES
from cascade_jax.checkpoint._safetensors import Files

LOADERS = {'qwen3_moe': _hf_qwen3.load_hf_qwen3_moe,
           'nemotron_h': _hf_nemotron_h.load_hf_nemotron_h}


def checkpoint_dtype(files: Files) -> str:
  """The float dtype most of a checkpoint's bytes are stored in."""
  size = collections.Counter()
  for name in files.keys():
    t = files[name]
    if t.dtype in FLOAT_DTYPES:
      size[t.dtype] += t.nbytes
  if not size:
    raise ValueError(f'{files.path}: no floating-point tensors')
  return np.dtype(DTYPES[size.most_common(1)[0][0]]).name


def load_hf(path: str, *, dtype: str = '', dispatch: str = 'dropless',
            ctx=None):
  """(ModelConfig, model): a Hugging Face checkpoint directory, streamed
  onto `ctx`'s mesh. `dtype` '' keeps the checkpoint's own."""
  kind = read_config(path).get('model_type')
  if kind not in LOADERS:
    raise ValueError(f'{path}/config.json: model_type {kind!r} is not one '
                     f'this library imports (known: {sorted(LOADERS)})')
  dtype = dtype or checkpoint_dtype(Files(path))
  return LOADERS[kind](path, dtype=dtype, dispatch=dispatch, ctx=ctx)
