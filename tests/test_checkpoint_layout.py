"""Stacked layers: checkpoints written before the change are refused by name, converted, and resume where they would have."""

import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from cascade_jax import checkpoint
from cascade_jax import model
from cascade_jax import sft
from cascade_jax import train

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
from configs import sft as sft_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import convert_checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position

_FIXTURE = os.path.join(_ROOT, 'tests', 'data', 'per_layer_sft_2026-12-02')


def _fixture_config():
  """The config the fixture's run was made with (its README)."""
  c = sft_config.get_config('quick')
  c.steps, c.optim.decay_steps, c.optim.warmup_steps = 4, 4, 1
  c.checkpoint_every, c.log_every, c.eval_n = 2, 1, 0
  c.model.overrides.embed_dim, c.model.overrides.head_dim = 32, 8
  c.model.overrides.moe.expert_dim = 16
  c.model.overrides.moe.shared_expert_dim = 16
  return c


@pytest.mark.slow  # ~20 s, old checkpoints: CI runs it
def test_a_per_layer_run_is_refused_then_converted_and_resumes(tmp_path):
  run = str(tmp_path / 'run')
  shutil.copytree(_FIXTURE, run)
  with pytest.raises(ValueError, match='experiments.convert_checkpoint'):
    sft.run(_fixture_config(), run)
  assert convert_checkpoint.convert_run(run) == 1
  assert os.path.isdir(os.path.join(run, 'checkpoints.per_layer'))
  assert convert_checkpoint.convert_run(run) == 0     # once only
  sft.run(_fixture_config(), run)
  rows = [json.loads(l) for l in open(os.path.join(run, 'sft_metrics.jsonl'))]
  got = {r['step']: r for r in rows if 'loss' in r and r['step'] > 2}
  want = [json.loads(l) for l in open(
      os.path.join(_FIXTURE, 'expected_steps_3_4.jsonl'))]
  assert sorted(got) == [3, 4]
  _check_moments(run)
  # Step 3 is the restored weights on the restored data position; step 4
  # adds the restored Adam moments (within the stacked gradient's rounding
  # as Adam amplifies it, README; the moments' places are checked exactly
  # by `_check_moments`).
  for w, rtol in zip(want, (1e-5, 1e-3)):
    for key in ('loss', 'grad_norm', 'tokens', 'dropped', 'lr'):
      np.testing.assert_allclose(got[w['step']][key], w[key], rtol=rtol,
                                 err_msg=f'step {w["step"]} {key}')


def _check_moments(run):
  """Every per-parameter optimizer leaf of the converted checkpoint is the
  old one of the same layer, placed by `ModelConfig.layer_slots`."""
  spec = train.model_spec(run)
  cfg = train.model_config(spec['preset'], spec['overrides'])
  old, _ = checkpoint.Checkpointer(
      os.path.join(run, 'checkpoints.per_layer')).read(2)
  new, _ = checkpoint.Checkpointer(os.path.join(run, 'checkpoints')).read(2)
  old_params = checkpoint.int_keys(old['params'])
  old_paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(old_params)]
  m = nnx.eval_shape(lambda: model.Transformer(cfg, rngs=nnx.Rngs(0)))
  new_params = nnx.state(m, nnx.Param).to_pure_dict()
  new_index = {p: i for i, (p, _) in enumerate(
      jax.tree_util.tree_leaves_with_path(new_params))}
  n_old, n_new = len(old_paths), len(new_index)
  assert len(old['opt_state']) - 2 * n_old == len(new['opt_state']) - 2 * n_new
  first_old, first_new = 1, 1         # Adam: [count, mu..., nu..., ...]
  for moment in range(2):
    for i, path in enumerate(old_paths):
      keys = [getattr(k, 'key', None) for k in path]
      if keys[0] == 'blocks':
        g, j, k = cfg.layer_slots[keys[1]]
        where = ('layers', g, 'blocks', j, *keys[2:])
      else:
        g, where = None, tuple(keys)
      new_path = tuple(jax.tree_util.DictKey(w) for w in where)
      got = np.asarray(new['opt_state'][first_new + moment * n_new +
                                        new_index[new_path]])
      want = np.asarray(old['opt_state'][first_old + moment * n_old + i])
      np.testing.assert_array_equal(got if g is None else got[k], want,
                                    err_msg=str(where))


def test_stack_layers_matches_the_model_layout():
  # Layer i of a per-layer tree lands where the stacked model keeps it.
  cfg = model.tiny(pattern='*E*E*-')
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  per_layer = {'blocks': {i: nnx.state(m.layer(i)).to_pure_dict()
                          for i in range(cfg.num_layers)},
               'embed_vd': np.asarray(m.embed_vd[...])}
  stacked = checkpoint.stack_layers(cfg, per_layer)
  want = nnx.state(m).to_pure_dict()
  assert jax.tree.structure(stacked['layers']) == jax.tree.structure(
      want['layers'])
  jax.tree.map(np.testing.assert_array_equal, stacked['layers'],
               want['layers'])
  with pytest.raises(ValueError, match='has layers up to 6, the model 6'):
    checkpoint.stack_layers(cfg, {'blocks': {i: {} for i in range(7)}})
  with pytest.raises(ValueError, match=r'lacks layers \[2\]'):
    checkpoint.stack_layers(cfg, {'blocks': {0: {'a': 1}}})
