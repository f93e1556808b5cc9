"""A Hugging Face checkpoint as a run directory: streamed onto the mesh, then written as an Orbax checkpoint.

`import_hf(hf_dir, run_dir, ctx=...)` reads the checkpoint's config.json,
maps it to a ModelConfig (Qwen3-MoE or Nemotron-H), streams every
device's slice of every weight from the safetensors files into its
sharding (`checkpoint.load_hf`: no process reads what its devices do not
hold), and writes what any stage restores (`restore_run`, `init_from`):

  config.json   the import's settings and where the weights came from
  model.json    the model as a preset + overrides
  hf_tokenizer/ the checkpoint's tokenizer files (tokenizer.json, its
                chat template, generation_config.json), as they are
  checkpoints/0 the weights (`params`, `rest`), in the stacked layout
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

from absl import logging
from flax import nnx

from cascade_jax import checkpoint
from cascade_jax import data
from cascade_jax import model as model_lib
from cascade_jax.train import _setup
from cascade_jax.train._restore import HF_TOKENIZER

# Files a Hugging Face checkpoint ships its tokenizer and chat template in.
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json',
                   'special_tokens_map.json', 'chat_template.jinja',
                   'generation_config.json', 'tokenizer.model', 'vocab.json',
                   'merges.txt')


def model_spec_of(cfg: model_lib.ModelConfig) -> dict:
  """`cfg` as model.json's preset + overrides (the fields that differ)."""
  preset = ('nemotron3_nano_30b_a3b' if cfg.mamba is not None
            else 'qwen3_30b_a3b')
  base = model_lib.preset(preset)
  overrides = {}
  for f in dataclasses.fields(cfg):
    mine, theirs = getattr(cfg, f.name), getattr(base, f.name)
    if f.name in ('moe', 'mamba'):
      if mine is None:
        if theirs is not None:
          overrides[f.name] = None
        continue
      sub = {g.name: getattr(mine, g.name) for g in dataclasses.fields(mine)
             if theirs is None or getattr(mine, g.name) != getattr(theirs, g.name)}
      if sub:
        overrides[f.name] = sub
    elif mine != theirs:
      overrides[f.name] = mine
  return dict(preset=preset, overrides=overrides)


def import_hf(hf_dir: str, run_dir: str, *, ctx=None, dtype: str = '',
              dispatch: str = 'dropless', settings: dict | None = None):
  """(model config, model on `ctx`'s mesh): `hf_dir` imported into `run_dir`.

  `dtype`: the weights' dtype ('' keeps the checkpoint's); `dispatch`: the
  MoE dispatch recorded for the run ('dropless': a plain forward of the
  restored run computes what transformers computes).
  """
  cfg, model = checkpoint.load_hf(hf_dir, dtype=dtype, dispatch=dispatch,
                                  ctx=ctx)
  os.makedirs(run_dir, exist_ok=True)
  main = _setup.is_main_process()
  if main:
    with open(os.path.join(run_dir, 'config.json'), 'w') as f:
      json.dump(dict(settings or {}, kind='import_hf',
                     hf_dir=os.path.abspath(hf_dir), dtype=cfg.param_dtype,
                     dispatch=dispatch), f, indent=2)
  _setup.write_model_json(run_dir, model_spec_of(cfg))
  copied = [n for n in TOKENIZER_FILES
            if os.path.exists(os.path.join(hf_dir, n))]
  if main and copied:
    os.makedirs(os.path.join(run_dir, HF_TOKENIZER), exist_ok=True)
    for n in copied:
      shutil.copy(os.path.join(hf_dir, n),
                  os.path.join(run_dir, HF_TOKENIZER, n))
  if 'tokenizer.json' not in copied:
    logging.warning('%s has no tokenizer.json: imported the weights alone',
                    hf_dir)
  elif main:
    tok = data.load_hf_tokenizer(os.path.join(run_dir, HF_TOKENIZER))
    data.check_vocab(tok, cfg.vocab_size)
  _, params, rest = nnx.split(model, nnx.Param, ...)
  # 0.25 GB in flight: the save's host copies stay a small part of the
  # model (Orbax's default, 96 GB, copied every array at once: +0.6 x the
  # checkpoint's bytes in bench_import's one-process import).
  ck = checkpoint.Checkpointer(os.path.join(run_dir, 'checkpoints'),
                               max_to_keep=1, async_save=False,
                               save_concurrent_gb=0.25)
  try:
    ck.save(0, dict(params=params.to_pure_dict(), rest=rest.to_pure_dict()),
            dict(imported_from=os.path.abspath(hf_dir)))
  finally:
    ck.close()
  return cfg, model
