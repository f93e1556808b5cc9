"""Config validation, presets and parameter counts."""

import re

import pytest

from cascade_jax import model
from cascade_jax import sharding


@pytest.mark.parametrize('kw, field', [
    (dict(num_heads=4, num_kv_heads=3), 'num_kv_heads'),
    (dict(pattern='*X'), 'pattern'),
    (dict(pattern=''), 'pattern'),
    (dict(pattern='*-', mlp_dim=0), 'mlp_dim'),
    (dict(moe=None), 'moe'),
    (dict(head_dim=7), 'head_dim'),
    (dict(dtype='float16'), 'dtype'),
    (dict(pattern='*M'), 'mamba'),
])
def test_model_config_errors_name_the_field(kw, field):
  with pytest.raises(ValueError, match=f'^{re.escape(field)}:'):
    model.tiny(**kw)


@pytest.mark.parametrize('kw, field', [
    (dict(top_k=5), 'moe.top_k'),
    (dict(top_k=0), 'moe.top_k'),
    (dict(dispatch='gshard'), 'moe.dispatch'),
    (dict(score_fn='tanh'), 'moe.score_fn'),
    (dict(num_shared_experts=1), 'moe.shared_expert_dim'),
    (dict(capacity_factor=0.0), 'moe.capacity_factor'),
])
def test_moe_config_errors_name_the_field(kw, field):
  with pytest.raises(ValueError, match=f'^{re.escape(field)}:'):
    model.MoEConfig(**{**dict(num_experts=4, top_k=2, expert_dim=8), **kw})


def test_mamba_layers_build():
  cfg = model.nemotron3_nano_30b_a3b(
      vocab_size=32, embed_dim=16, pattern='M*E', num_heads=2,
      num_kv_heads=1, head_dim=8, dtype='float32', param_dtype='float32',
      moe=model.MoEConfig(num_experts=4, top_k=2, expert_dim=8),
      mamba=model.MambaConfig(num_heads=4, head_dim=4, state_dim=4,
                              num_groups=2, chunk_size=4))
  from flax import nnx
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  assert m.layer(0).kind == 'M' and m.layers[0].unit == 'M*E'


def test_unknown_preset():
  with pytest.raises(ValueError, match='unknown model preset'):
    model.preset('gpt5')


@pytest.mark.parametrize('name', sorted(model.PRESETS))
def test_presets_build_every_layer_of_their_pattern_once(name):
  # The stacked layout (one Stack per layer group, its blocks a unit's
  # positions with a leading repeat axis) holds the pattern's layers, each
  # of its kind, in order, once.
  from flax import nnx  # pylint: disable=g-import-not-at-top
  cfg = model.preset(name)
  m = nnx.eval_shape(lambda: model.Transformer(cfg, rngs=nnx.Rngs(0)))
  built = ''
  for (unit, repeats), stack in zip(cfg.layer_groups, m.layers, strict=True):
    kinds = ''.join(b.kind for b in stack.blocks)
    assert kinds == unit
    assert all(b.norm.scale.shape[0] == repeats for b in stack.blocks)
    built += kinds * repeats
  assert built == cfg.pattern and cfg.num_layers == len(cfg.pattern)


def test_qwen3_30b_a3b_count_matches_published():
  # Published: 30.5B total, 3.3B active.
  c = model.count_params(model.qwen3_30b_a3b())
  assert abs(c.total / 30.5e9 - 1) < 0.01, c
  assert abs(c.active / 3.3e9 - 1) < 0.02, c  # "3.3B" is rounded to 0.1B


def test_nemotron3_nano_count_matches_published():
  # Published: 31.6B total, 3.2B active, 3.6B with embeddings.
  c = model.count_params(model.nemotron3_nano_30b_a3b())
  assert abs(c.total / 31.6e9 - 1) < 0.01, c
  assert abs(c.active / 3.6e9 - 1) < 0.01, c
  assert abs((c.active - c.embedding) / 3.2e9 - 1) < 0.02, c


def test_count_params_by_hand():
  # tiny: vocab 32, embed 16, '*E*-', 4 heads / 2 kv heads of 8, mlp 32,
  # 4 experts of width 16, top-2, SwiGLU, untied.
  d, v = 16, 32
  attn = d * 4 * 8 + 2 * d * 2 * 8 + 4 * 8 * d + d       # q, k, v, o, norm
  experts = 4 * 3 * d * 16
  moe = experts + d * 4 + d                                # + router, norm
  mlp = 3 * d * 32 + d
  total = v * d * 2 + d + 2 * attn + moe + mlp             # + final norm
  c = model.count_params(model.tiny())
  assert c.total == total
  assert c.active == total - experts // 2


@pytest.mark.parametrize('shape, msg', [
    (dict(data=3), 'need 3 devices'),
    (dict(data=3, expert=-1), 'do not divide'),
    (dict(pipeline=2), 'unknown axis'),
    (dict(data=-1, expert=-1), 'at most one'),
])
def test_mesh_errors(shape, msg):
  with pytest.raises(ValueError, match=msg):
    sharding.make_mesh(shape)


def test_mesh_fills_free_axis():
  mesh = sharding.make_mesh(dict(data=-1, expert=2))
  assert dict(mesh.shape) == dict(data=4, fsdp=1, expert=2, tensor=1)


def test_rules_errors():
  with pytest.raises(ValueError, match='unknown logical axis'):
    sharding.validate_rules((('experts', 'expert'),))
  with pytest.raises(ValueError, match='unknown mesh axis'):
    sharding.validate_rules((('exp', 'pipeline'),))
