"""Models from run directories: a stage's checkpoint becomes the next stage's policy, reference or teacher."""

from __future__ import annotations

import json
import os
import shutil

from absl import logging

from flax import nnx

from cascade_jax import checkpoint
from cascade_jax import data
from cascade_jax import model as model_lib
from cascade_jax.train._state import model_config

# Where a run keeps a Hugging Face tokenizer's files (tokenizer.json, its
# config and chat template, generation_config.json).
HF_TOKENIZER = 'hf_tokenizer'


def restore_run(run_dir: str, *, ctx=None, memory: dict | None = None):
  """(model config, model with the run's latest weights, tokenizer).

  Rebuilds the run's model (model.json) as shapes only and restores the
  latest checkpoint's weights into it, on `ctx`'s mesh straight into their
  shardings. `memory`: ModelConfig fields that change how the model
  computes, not its weights (remat, scan_layers, logits_chunk, dtype).
  """
  cfg, model, tok = model_shell(run_dir, ctx=ctx, memory=memory)
  graph, params, rest = restore_latest(model, run_dir)
  return cfg, nnx.merge(graph, params, rest), tok


def model_shell(run_dir: str, *, ctx=None, memory: dict | None = None):
  """(model config, the run's model as shapes only, tokenizer or None).

  The model's variables are `jax.ShapeDtypeStruct`s (with the rules'
  shardings on `ctx`'s mesh): no random init to throw away, nothing
  allocated until a restore fills them.
  """
  if not os.path.exists(os.path.join(run_dir, 'config.json')):
    raise FileNotFoundError(f'{run_dir} is not a run directory (no '
                            'config.json)')
  m = model_spec(run_dir)
  cfg = model_config(m['preset'], m.get('overrides') or {})
  cfg = cfg.replace(**dict(memory or {}))
  model = abstract_model(cfg, ctx)
  tok = run_tokenizer(run_dir)
  if tok is None:   # e.g. an import of weights alone
    logging.warning('%s has no tokenizer (tokenizer.model or hf_tokenizer/):'
                    ' restored without one', run_dir)
    return cfg, model, None
  data.check_vocab(tok, cfg.vocab_size)
  return cfg, model, tok


def run_tokenizer(run_dir: str):
  """A run's tokenizer: `hf_tokenizer/` (a Hugging Face tokenizer.json and
  chat template, from an import) or `tokenizer.model` (sentencepiece);
  None when it has neither."""
  hf = os.path.join(run_dir, HF_TOKENIZER)
  if os.path.exists(os.path.join(hf, 'tokenizer.json')):
    return data.load_hf_tokenizer(hf)
  path = os.path.join(run_dir, 'tokenizer.model')
  return data.load_tokenizer(path) if os.path.exists(path) else None


def copy_tokenizer(src_run: str, dst_run: str) -> None:
  """Copies a run's tokenizer files into another run directory."""
  hf = os.path.join(src_run, HF_TOKENIZER)
  if os.path.isdir(hf):
    shutil.copytree(hf, os.path.join(dst_run, HF_TOKENIZER),
                    dirs_exist_ok=True)
  path = os.path.join(src_run, 'tokenizer.model')
  if os.path.exists(path):
    shutil.copy(path, os.path.join(dst_run, 'tokenizer.model'))


def abstract_model(cfg, ctx=None) -> model_lib.Transformer:
  """A Transformer of ShapeDtypeStructs, sharded by the rules on `ctx`."""
  return model_lib.abstract_model(cfg, ctx)


def restore_latest(module: nnx.Module, run_dir: str):
  """(graph, params, rest): `module`'s weights from the run's latest checkpoint.

  `module` may be abstract (`nnx.eval_shape`). Only the weights are read,
  not the optimizer state: a new stage starts its own optimizer.
  """
  ck = checkpoint.Checkpointer(os.path.join(run_dir, 'checkpoints'))
  try:
    if ck.latest_step() is None:
      raise FileNotFoundError(f'{run_dir} has no checkpoint to restore')
    graph, params, rest = nnx.split(module, nnx.Param, ...)
    restored, _ = ck.restore(dict(params=params.to_pure_dict(),
                                  rest=rest.to_pure_dict()), partial=True)
  finally:
    ck.close()
  nnx.replace_by_pure_dict(params, restored['params'])
  nnx.replace_by_pure_dict(rest, restored['rest'])
  return graph, params, rest


def model_spec(run_dir: str) -> dict:
  """The model (preset + overrides) a run trained: its `model.json`.

  Runs written before stages recorded their model: their own config's, or
  that of the run they started from (a relative `init_from` is a sibling
  in the cascade's directory).
  """
  path = os.path.join(run_dir, 'model.json')
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  with open(os.path.join(run_dir, 'config.json')) as f:
    run_cfg = json.load(f)
  if 'model' in run_cfg:
    return run_cfg['model']
  if run_cfg.get('init_from'):
    init = run_cfg['init_from']
    if not os.path.isabs(init):
      init = os.path.join(os.path.dirname(os.path.abspath(run_dir)), init)
    return model_spec(init)
  raise ValueError(f'{run_dir} has no model.json, and its config.json names '
                   'no model and no init_from')
