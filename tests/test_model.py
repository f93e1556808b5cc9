"""The decoder: masking, packing, RoPE, routing replay, tied heads, dtypes (its KV-cache forward: tests/test_rollout.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import model
from cascade_jax.model import _attention

from _jit import call


def _tokens(b, t, v=32, seed=1):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, v)


def test_attention_mask_by_hand():
  # Two packed segments [a a | b b b] then one pad slot.
  pos = jnp.array([[0, 1, 0, 1, 2, 0]])
  seg = jnp.array([[1, 1, 2, 2, 2, 0]])
  m = np.asarray(model.attention_mask(pos, seg, pos, seg)[0]).astype(int)
  want = np.array([[1, 0, 0, 0, 0, 0],
                   [1, 1, 0, 0, 0, 0],
                   [0, 0, 1, 0, 0, 0],
                   [0, 0, 1, 1, 0, 0],
                   [0, 0, 1, 1, 1, 0],
                   [0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(m, want)


def test_rope_is_a_rotation_and_relative():
  x = jax.random.normal(jax.random.key(0), (1, 5, 2, 8))
  pos = jnp.arange(5)[None]
  r = _attention.rope(x, pos, 10_000.0)
  np.testing.assert_allclose(jnp.linalg.norm(r, axis=-1),
                             jnp.linalg.norm(x, axis=-1), rtol=1e-5)
  # <rope(q, i), rope(k, j)> depends only on i - j.
  q = jnp.broadcast_to(x[:, :1], x.shape)
  k = jnp.broadcast_to(x[:, 1:2], x.shape)
  a = _attention.rope(q, pos, 1e4)[0, 1] @ _attention.rope(k, pos, 1e4)[0, 0].T
  b = _attention.rope(q, pos + 7, 1e4)[0, 1] @ _attention.rope(k, pos + 7, 1e4)[0, 0].T
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('use_rope', [True, False])
@pytest.mark.parametrize('dispatch', [  # the main job's (capacity); CI all
    pytest.param('dense', marks=pytest.mark.slow),
    pytest.param('ragged', marks=pytest.mark.slow), 'capacity'])
def test_packed_equals_unpacked(use_rope, dispatch):
  cfg = model.tiny(use_rope=use_rope).replace_moe(dispatch=dispatch,
                                                  capacity_factor=2.0)
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  a, b = _tokens(1, 3, seed=2)[0], _tokens(1, 4, seed=3)[0]
  packed = jnp.concatenate([a, b, jnp.zeros(1, jnp.int32)])[None]
  seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
  pos = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]])
  lp, _ = call(m, packed, positions_bt=pos, segment_ids_bt=seg)
  la, _ = call(m, a[None])
  lb, _ = call(m, b[None])
  np.testing.assert_allclose(lp[0, :3], la[0], atol=1e-5)
  np.testing.assert_allclose(lp[0, 3:7], lb[0], atol=1e-5)
  assert np.isfinite(np.asarray(lp)).all()  # the pad row too


def test_tied_embeddings_share_the_table():
  cfg = model.tiny(tie_embeddings=True)
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  assert m.head_dv is None
  _, info = call(m, _tokens(1, 4), return_hidden=True)
  logits, _ = call(m, _tokens(1, 4))
  np.testing.assert_allclose(logits, info['hidden'] @ m.embed_vd[...].T,
                             atol=1e-5)


def test_router_info_and_replay():
  cfg = model.tiny(pattern='*E*E')
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  toks = _tokens(3, 5)
  logits, info = call(m, toks)
  assert info['expert_idx'].shape == (3, 5, 2, 2)   # [B, T, L_moe, k]
  assert info['router']['load'].shape == (2, 4)
  np.testing.assert_allclose(info['router']['load'].sum(-1), 1.0, rtol=1e-6)
  replayed, _ = call(m, toks, expert_idx=info['expert_idx'])
  np.testing.assert_array_equal(replayed, logits)
  forced = jnp.zeros_like(info['expert_idx']).at[..., 1].set(1)
  other, info2 = call(m, toks, expert_idx=forced)
  np.testing.assert_array_equal(info2['expert_idx'], forced)
  assert not np.allclose(other, logits)


# CI: the main job computes in fp32 (a bf16 sampler's correction:
# tests/test_losses.py).
@pytest.mark.slow
def test_bfloat16_activations_stay_close():
  cfg = model.tiny()
  toks = _tokens(2, 6)
  l32, _ = model.Transformer(cfg, rngs=nnx.Rngs(0))(toks)
  l16, _ = model.Transformer(cfg.replace(dtype='bfloat16'),
                             rngs=nnx.Rngs(0))(toks)
  assert l16.dtype == jnp.float32
  np.testing.assert_allclose(l16, l32, atol=0.1)
