"""Models from run directories: a stage's checkpoint becomes the next stage's policy, reference or teacher."""

from __future__ import annotations

import json
import os

from flax import nnx

from cascade_jax import checkpoint
from cascade_jax import data
from cascade_jax import model as model_lib
from cascade_jax.train._state import model_config


def restore_run(run_dir: str, *, ctx=None):
  """(model config, model with the run's latest weights, tokenizer).

  Reads the run's resolved `config.json`, rebuilds its model and optimizer
  state layout, and restores the latest checkpoint into it.
  """
  cfg, model, tok = model_shell(run_dir, ctx=ctx)
  graph, params, rest = restore_latest(model, run_dir)
  return cfg, nnx.merge(graph, params, rest), tok


def model_shell(run_dir: str, *, ctx=None):
  """(model config, the run's model without its weights, tokenizer).

  Unsharded the model is abstract (`nnx.eval_shape`: shapes only, no random
  init to throw away); sharded it holds real arrays, whose shardings a
  restore follows.
  """
  cfg_path = os.path.join(run_dir, 'config.json')
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f'{run_dir} is not a run directory (no '
                            'config.json)')
  m = model_spec(run_dir)
  cfg = model_config(m['preset'], m.get('overrides') or {})
  build = lambda: model_lib.Transformer(cfg, rngs=nnx.Rngs(0), ctx=ctx)
  model = nnx.eval_shape(build) if ctx is None else build()
  tok = data.load_tokenizer(os.path.join(run_dir, 'tokenizer.model'))
  data.check_vocab(tok, cfg.vocab_size)
  return cfg, model, tok


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
  """The model (preset + overrides) a run trained: its own config's, or,
  for a stage started from another run, that run's (recursively)."""
  with open(os.path.join(run_dir, 'config.json')) as f:
    run_cfg = json.load(f)
  if 'model' in run_cfg:
    return run_cfg['model']
  if run_cfg.get('init_from'):
    return model_spec(run_cfg['init_from'])
  raise ValueError(f'{run_dir}/config.json names no model and no init_from')
