"""Hugging Face Qwen3-MoE import / export against transformers (torch CPU)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from cascade_jax import checkpoint  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  torch.manual_seed(0)
  cfg = transformers.Qwen3MoeConfig(
      vocab_size=64, hidden_size=32, intermediate_size=48,
      moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
      norm_topk_prob=True, max_position_embeddings=128, mlp_only_layers=[1],
      rope_theta=1000.0)
  m = transformers.Qwen3MoeForCausalLM(cfg).eval()
  with torch.no_grad():  # random norm scales, so a wrong norm mapping shows
    for name, p in m.named_parameters():
      if name.endswith('norm.weight'):
        p.uniform_(0.5, 1.5)
  path = str(tmp_path_factory.mktemp('qwen3moe'))
  m.save_pretrained(path)
  return path, m


def _tokens():
  return np.random.RandomState(0).randint(0, 64, (2, 12))


@pytest.mark.parametrize('dispatch', ['dense', 'ragged'])
def test_import_matches_transformers_logits(hf_dir, dispatch):
  path, hf_model = hf_dir
  cfg, ours = checkpoint.load_hf_qwen3_moe(path, dispatch=dispatch)
  assert cfg.pattern == '*E*-*E'   # layer 1 is in mlp_only_layers
  with torch.no_grad():
    want = hf_model(torch.tensor(_tokens())).logits.numpy()
  got, _ = ours(jnp.asarray(_tokens()))
  assert np.abs(np.asarray(got) - want).max() < 1e-4


def test_export_round_trips_through_transformers(hf_dir, tmp_path):
  path, hf_model = hf_dir
  cfg, ours = checkpoint.load_hf_qwen3_moe(path)
  checkpoint.save_hf_qwen3_moe(cfg, ours, str(tmp_path))
  again = transformers.Qwen3MoeForCausalLM.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    want = hf_model(torch.tensor(_tokens())).logits.numpy()
    got = again(torch.tensor(_tokens())).logits.numpy()
  assert np.abs(got - want).max() < 1e-5


def test_checkpoint_that_does_not_fit_is_named(hf_dir, tmp_path):
  path, _ = hf_dir
  cfg_json = json.load(open(os.path.join(path, 'config.json')))
  cfg_json['num_hidden_layers'] = 4   # the files hold 3 layers
  os.symlink(os.path.join(path, 'model.safetensors'),
             tmp_path / 'model.safetensors')
  json.dump(cfg_json, open(tmp_path / 'config.json', 'w'))
  with pytest.raises(ValueError, match=r'lacks .*model.layers.3'):
    checkpoint.load_hf_qwen3_moe(str(tmp_path))
  cfg_json['num_hidden_layers'] = 2
  json.dump(cfg_json, open(tmp_path / 'config.json', 'w'))
  with pytest.raises(ValueError, match=r'do not fit the model.*layers.2'):
    checkpoint.load_hf_qwen3_moe(str(tmp_path))
  cfg_json['num_hidden_layers'] = 3
  cfg_json['head_dim'] = 4
  json.dump(cfg_json, open(tmp_path / 'config.json', 'w'))
  with pytest.raises(ValueError, match=r'q_proj.weight has shape \(32, 32\)'):
    checkpoint.load_hf_qwen3_moe(str(tmp_path))


def test_non_qwen_config_is_refused(tmp_path):
  json.dump({'model_type': 'llama'}, open(tmp_path / 'config.json', 'w'))
  with pytest.raises(ValueError, match="is not 'qwen3_moe'"):
    checkpoint.load_hf_qwen3_moe(str(tmp_path))


def test_export_refuses_a_nemotron_style_model():
  from cascade_jax import model  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  cfg = model.small()
  with pytest.raises(ValueError, match='cannot be exported as Qwen3-MoE'):
    checkpoint.save_hf_qwen3_moe(cfg, model.Transformer(cfg, rngs=nnx.Rngs(0)),
                                 '/tmp/never')
