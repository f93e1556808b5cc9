"""The CPU MoE kernel (cascade_jax.kernels): equal to the dense path, deterministic, and its fallbacks."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import kernels
from cascade_jax import model
from cascade_jax.kernels import _build

needs_kernel = pytest.mark.skipif(
    not kernels.moe_ffn_available('swiglu', jnp.float32),
    reason='the CPU MoE kernel cannot be built here')


def _problem(n, k, e, d, f, act, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.randn(n, d).astype(np.float32)
  idx = np.stack([rng.choice(e, k, replace=False) for _ in range(n)])
  w = rng.rand(n, k).astype(np.float32)
  ws = [rng.randn(*s).astype(np.float32) / np.sqrt(s[1])
        for s in ((e, d, f), (e, d, f), (e, f, d))]
  if act != 'swiglu':
    ws[1] = None
  return x, idx.astype(np.int32), w, ws


def _dense(x, idx, w, ws, act):
  y, _ = model.expert_forward(
      x, idx, w, tuple(ws), act=act, dispatch='dense',
      num_experts=ws[0].shape[0], capacity_factor=1.0)
  return y


def test_kernel_builds_where_a_compiler_exists():
  # CI must not pass by silently falling back to XLA's ops.
  if jax.default_backend() != 'cpu' or not (shutil.which('c++') or
                                            shutil.which('g++')):
    pytest.skip('no CPU backend or no C++ compiler')
  assert kernels.moe_ffn_available('swiglu', jnp.float32)
  assert kernels.moe_ffn_available('relu2', jnp.float32)
  assert not kernels.moe_ffn_available('swiglu', jnp.bfloat16)
  assert not kernels.moe_ffn_available('gelu', jnp.float32)


@needs_kernel
@pytest.mark.parametrize('n, k, e, d, f, act', [
    (1, 2, 8, 64, 128, 'swiglu'),    # two experts, one row each
    (13, 2, 4, 64, 128, 'swiglu'),   # 1-6 row blocks with remainders
    (9, 1, 3, 20, 70, 'relu2'),      # column tails (D, F not multiples of 64)
    (150, 1, 2, 32, 64, 'swiglu'),   # > 64 rows of one expert: several units
    (5, 2, 16, 16, 24, 'relu2'),     # most experts unused
])
def test_moe_ffn_equals_dense(n, k, e, d, f, act):
  x, idx, w, ws = _problem(n, k, e, d, f, act)
  got = jax.jit(lambda *a: kernels.moe_ffn(*a, act=act))(x, idx, w, *ws)
  np.testing.assert_allclose(got, _dense(x, idx, w, ws, act), rtol=1e-5,
                             atol=1e-5)


@needs_kernel
def test_moe_ffn_is_deterministic():
  # Units are claimed by whichever thread is free, but each pair is computed
  # by one unit in a fixed order: bit-identical results run after run.
  x, idx, w, ws = _problem(64, 2, 8, 64, 128, 'swiglu')
  fn = jax.jit(lambda *a: kernels.moe_ffn(*a, act='swiglu'))
  first = np.asarray(fn(x, idx, w, *ws))
  for _ in range(5):
    np.testing.assert_array_equal(fn(x, idx, w, *ws), first)


@needs_kernel
def test_moe_ffn_is_batch_invariant():
  # Every row's sums run in the same order whatever else is in the batch
  # (row blocks of any height accumulate each row alone, k ascending): a
  # token alone gets bit-identical outputs to the same token among 50.
  x, idx, w, ws = _problem(50, 2, 8, 96, 200, 'swiglu')  # D, F with tails
  full = np.asarray(kernels.moe_ffn(x, idx, w, *ws, act='swiglu'))
  for i in (0, 7, 49):
    one = kernels.moe_ffn(x[i:i + 1], idx[i:i + 1], w[i:i + 1], *ws,
                          act='swiglu')
    np.testing.assert_array_equal(one[0], full[i])


@needs_kernel
def test_moe_ffn_skips_expert_ids_out_of_range():
  # An id outside [0, E) contributes nothing, like a pair with weight 0.
  x, idx, w, ws = _problem(6, 2, 4, 16, 24, 'swiglu')
  bad = idx.copy()
  bad[0, 1], bad[3, 0] = -1, 4
  w0 = w.copy()
  w0[0, 1] = w0[3, 0] = 0.0
  np.testing.assert_allclose(
      kernels.moe_ffn(x, bad, w, *ws, act='swiglu'),
      _dense(x, idx, w0, ws, 'swiglu'), rtol=1e-5, atol=1e-6)


@needs_kernel
def test_moe_ffn_rejects_a_missing_or_extra_up_projection():
  x, idx, w, ws = _problem(2, 2, 4, 16, 24, 'swiglu')
  with pytest.raises(ValueError, match="act 'swiglu' with w_up missing"):
    kernels.moe_ffn(x, idx, w, ws[0], None, ws[2], act='swiglu')
  with pytest.raises(ValueError, match="act 'relu2' with w_up given"):
    kernels.moe_ffn(x, idx, w, *ws, act='relu2')


@needs_kernel
@pytest.mark.parametrize('activation', ['swiglu', 'relu2'])
@pytest.mark.parametrize('tokens', [1, 5, 40])
def test_moe_decode_path_uses_kernel_and_equals_dense(activation, tokens):
  cfg = model.tiny(pattern='E', moe=model.MoEConfig(
      num_experts=8, top_k=2, expert_dim=16, dispatch='dense',
      activation=activation, num_shared_experts=1, shared_expert_dim=8))
  m = model.MoE(cfg, rngs=nnx.Rngs(0))
  dw = m.decode_weights(jnp.float32, tokens)
  assert dw.kernel is not None and dw.flat is None and dw.per_expert is None
  x = jax.random.normal(jax.random.key(tokens), (1, tokens, 16))
  ref, info = m(x, with_stats=False)
  y, info_dec = jax.jit(lambda x, dw: m(x, with_stats=False,
                                        decode_weights=dw))(x, dw)
  np.testing.assert_array_equal(info_dec['expert_idx'], info['expert_idx'])
  np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


def test_disabled_by_environment(monkeypatch):
  monkeypatch.setenv(_build.DISABLE_ENV, '0')
  assert _build.moe_ffn_target.__wrapped__() is None


def test_a_failed_build_falls_back_with_the_compiler_error(
    monkeypatch, tmp_path):
  # A compiler that fails: the warning carries its command and stderr, and
  # callers get None (XLA's ops), not an exception.
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  monkeypatch.setenv('CXX', 'false')
  warnings = []
  monkeypatch.setattr(_build.logging, 'warning',
                      lambda msg, *a: warnings.append(msg % a))
  assert _build.moe_ffn_target.__wrapped__() is None
  assert len(warnings) == 1 and 'false -O3 -march=native' in warnings[0], warnings
  assert not list(tmp_path.rglob('*.so'))
