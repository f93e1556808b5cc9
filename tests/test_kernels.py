"""The CPU MoE kernel (cascade_jax.kernels): equal to the dense path, deterministic, and its fallbacks."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import kernels
from cascade_jax import model
from cascade_jax import ops
from cascade_jax import rollout
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
  y, *_ = model.expert_forward(
      x, idx, w, tuple(ws), act=act, dispatch='dense',
      num_experts=ws[0].shape[0], capacity_factor=1.0)
  return y


def test_kernel_builds_where_a_compiler_exists():
  # CI must not pass by silently falling back to XLA's ops.
  if jax.default_backend() != 'cpu' or not (shutil.which('c++') or
                                            shutil.which('g++')):
    pytest.skip('no CPU backend or no C++ compiler')
  if os.environ.get(_build.DISABLE_ENV, '') == '0':
    pytest.skip('the CPU kernels are turned off (CASCADE_JAX_CPU_KERNELS=0)')
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
  with ops.forced(moe_decode='cpu_kernel'):
    dw = rollout.decode_weights(m.expert_weights(jnp.float32), tokens, 2,
                                act=activation)
  assert dw.kernel is not None and dw.flat is None and dw.per_expert is None
  x = jax.random.normal(jax.random.key(tokens), (1, tokens, 16))
  ref, info = m(x, with_stats=False)
  y, _ = jax.jit(lambda x, dw: rollout.moe_step(m, x[0], dw))(x, dw)
  np.testing.assert_allclose(y, ref[0], atol=1e-5, rtol=1e-5)



def test_disabled_by_environment(monkeypatch):
  monkeypatch.setenv(_build.DISABLE_ENV, '0')
  assert _build._library.__wrapped__() is None


def test_a_failed_build_falls_back_with_the_compiler_error(
    monkeypatch, tmp_path):
  # A compiler that fails: the warning carries its command and stderr, and
  # callers get None (XLA's ops), not an exception.
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  monkeypatch.setenv('CXX', 'false')
  monkeypatch.setenv(_build.DISABLE_ENV, '1')
  warnings = []
  monkeypatch.setattr(_build.logging, 'warning',
                      lambda msg, *a: warnings.append(msg % a))
  assert _build._library.__wrapped__() is None
  assert len(warnings) == 1 and 'false -O3 -march=native' in warnings[0], warnings
  assert not list(tmp_path.rglob('*.so'))


# --- KV-cache attention (attention_cpu.cc) ---------------------------------

needs_attention_kernel = pytest.mark.skipif(
    not kernels.cache_attention_available(jnp.float32),
    reason='the CPU attention kernel cannot be built here')


def _cache_problem(b, t, s, index, heads, kv_heads, head_dim, seed=0,
                   qk_norm=True, use_rope=True):
  """An Attention layer and one call's inputs over a cache holding `index` slots.

  Rows are left-padded by different amounts (segment 0: never attended) and,
  when t > 1, the new tokens of the last row start with padding too, so some
  queries see no slot at all. Slots past `index` hold stale values.
  """
  from cascade_jax.model._attention import Attention  # pylint: disable=g-import-not-at-top
  cfg = model.tiny(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                   qk_norm=qk_norm, use_rope=use_rope)
  layer = Attention(cfg, rngs=nnx.Rngs(seed))
  if qk_norm:  # scales other than the initial ones
    for norm in (layer.q_norm, layer.k_norm):
      norm.scale[...] = jnp.linspace(0.5, 1.5, head_dim)
  rng = np.random.RandomState(seed)
  x = rng.randn(b, t, cfg.embed_dim).astype(np.float32)
  ck = rng.randn(b, kv_heads, head_dim, s).astype(np.float32)
  cv = rng.randn(b, kv_heads, s, head_dim).astype(np.float32)
  pad = rng.randint(0, index + 1, b)
  pad[0] = 0
  slot = np.arange(s)
  cache_seg = ((slot[None] >= pad[:, None]) & (slot[None] < index)).astype(np.int32)
  cache_pos = np.maximum(slot[None] - pad[:, None], 0).astype(np.int32)
  length = np.maximum(index - pad, 0)
  seg = np.ones((b, t), np.int32)
  if t > 1:
    seg[-1, :t // 2] = 0
  pos = (length[:, None] + np.arange(t)[None]).astype(np.int32)
  index = jnp.int32(index)
  cache_pos = jax.lax.dynamic_update_slice_in_dim(cache_pos, pos, index, 1)
  cache_seg = jax.lax.dynamic_update_slice_in_dim(cache_seg, seg, index, 1)

  def call(layer, x, ck, cv):
    return layer(x, positions_bt=pos, segment_ids_bt=seg, kv_cache=(ck, cv),
                 cache_index=index, cache_positions_bs=cache_pos,
                 cache_segment_ids_bs=cache_seg)
  return layer, (x, ck, cv), call


@needs_attention_kernel
@pytest.mark.parametrize('qk_norm, use_rope', [(False, False), (True, False),
                                               (False, True)])
def test_cache_attention_without_qk_norm_or_rope(qk_norm, use_rope):
  layer, args, call = _cache_problem(3, 2, 20, 7, 4, 2, 16, qk_norm=qk_norm,
                                     use_rope=use_rope)
  with ops.forced(cache_attention='cpu_kernel'):
    y, (ck, _) = jax.jit(call)(layer, *args)
  with ops.forced(cache_attention='xla'):
    y_ref, (ck_ref, _) = jax.jit(lambda *a: call(*a))(layer, *args)
  np.testing.assert_allclose(ck, ck_ref, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)


@needs_attention_kernel
@pytest.mark.parametrize('b, t, s, index, heads, kv_heads, head_dim', [
    (5, 1, 40, 17, 4, 2, 16),    # a decode step
    (64, 1, 96, 60, 4, 2, 64),   # the benchmark's decode step (threads)
    (3, 6, 20, 0, 4, 2, 8),      # a prefill; padding queries see nothing
    (4, 2, 37, 35, 2, 1, 16),    # slots past the last whole vector (37 % 16)
    (2, 3, 12, 5, 6, 2, 24),     # G = 3, head dim not a multiple of 16
    (2, 3, 10, 9, 4, 4, 8),      # index + T > S: the start is clamped
    (3, 1, 50, 30, 8, 2, 128),   # head dim 128: values in column blocks
])
def test_cache_attention_equals_xla(b, t, s, index, heads, kv_heads,
                                    head_dim):
  layer, args, call = _cache_problem(b, t, s, index, heads, kv_heads, head_dim)
  ops.reset_selected()
  with ops.forced(cache_attention='cpu_kernel'):
    y, (ck, cv) = jax.jit(call)(layer, *args)
  assert ops.selected()['cache_attention'] == ['cpu_kernel (cpu, float32)']
  # A new function to trace (jax.jit(call) would reuse the kernel's trace).
  with ops.forced(cache_attention='xla'):
    y_ref, (ck_ref, cv_ref) = jax.jit(lambda *a: call(*a))(layer, *args)
  # The same slots written: values as given, keys QK-normed and rotated.
  np.testing.assert_array_equal(cv, cv_ref)
  np.testing.assert_allclose(ck, ck_ref, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)


@needs_attention_kernel
def test_cache_attention_is_batch_invariant_and_deterministic():
  # One unit per (row, kv head), each computed alone: a row's outputs are
  # bit-identical alone (one thread) and among 64 (both threads).
  rng = np.random.RandomState(1)
  q = rng.randn(64, 1, 4, 64).astype(np.float32)
  k_new, v_new = rng.randn(2, 64, 1, 2, 64).astype(np.float32)
  ck = rng.randn(64, 2, 64, 96).astype(np.float32)
  cv = rng.randn(64, 2, 96, 64).astype(np.float32)
  mask = np.zeros((64, 1, 96), bool)
  mask[:, :, 3:61] = True
  fn = jax.jit(lambda *a: kernels.cache_attention(*a, scale=0.125))
  full = np.asarray(fn(q, k_new, v_new, ck, cv, mask, 60)[0])
  np.testing.assert_array_equal(fn(q, k_new, v_new, ck, cv, mask, 60)[0], full)
  for i in (0, 33, 63):
    s = slice(i, i + 1)
    one = fn(q[s], k_new[s], v_new[s], ck[s], cv[s], mask[s], 60)[0]
    np.testing.assert_array_equal(one[0], full[i])


# --- argmax (argmax_cpu.cc) --------------------------------------------------


@pytest.mark.skipif(not kernels.argmax_available(jnp.float32),
                    reason='the CPU kernels cannot be built here')
@pytest.mark.parametrize('shape', [(64, 1024), (5, 37), (3, 4, 16), (7,)])
def test_argmax_equals_jnp_argmax(shape):
  x = np.random.RandomState(0).randn(*shape).astype(np.float32)
  flat = x.reshape(-1, shape[-1])
  flat[0, 1] = flat[0, -1] = 50.0         # a tie: the first index wins
  if flat.shape[0] > 2:
    flat[1, 2], flat[1, 0] = np.nan, np.inf  # a NaN counts as the maximum
    flat[2, :] = -np.inf
  if flat.shape[0] > 3:
    flat[3, -1] = 100.0                       # the very last element
  np.testing.assert_array_equal(jax.jit(kernels.argmax)(x),
                                jnp.argmax(x, axis=-1))


def test_a_run_keeps_the_cpu_kernels_it_started_with(tmp_path, monkeypatch):
  # A run records the kernels it used; resumed, it runs them again whatever
  # today's setting would pick, and an explicit setting that contradicts
  # its record is refused by name (it would change the run's numbers).
  run = str(tmp_path)
  monkeypatch.setenv(kernels.DISABLE_ENV, '0')
  assert ops.keep_run_kernels(run) == dict.fromkeys(ops.CPU_KERNEL_OPS, False)
  with open(os.path.join(run, 'cpu_kernels.json')) as f:
    assert set(json.load(f)) == {'kernels', 'machine', 'vector_isa'}
  monkeypatch.setenv(kernels.DISABLE_ENV, 'auto')        # resumed: kept
  assert ops.keep_run_kernels(run) == dict.fromkeys(ops.CPU_KERNEL_OPS, False)
  assert os.environ[kernels.DISABLE_ENV] == '0'          # its processes too
  assert ops.cpu_kernels_in_use() == dict.fromkeys(ops.CPU_KERNEL_OPS, False)
  with open(os.path.join(run, 'cpu_kernels.json'), 'w') as f:
    json.dump(dict(kernels=dict(moe_decode=True), machine='m'), f)
  monkeypatch.setenv(kernels.DISABLE_ENV, '0')
  with pytest.raises(ValueError, match="used the CPU kernels 'moe_decode'"):
    ops.keep_run_kernels(run)
  monkeypatch.setenv(kernels.DISABLE_ENV, 'argmax,nope')
  with pytest.raises(ValueError, match='a list of the kernels to run'):
    ops.cpu_kernels_in_use()
