"""cascade_jax.ops: the selection layer, and each implementation equal to the reference.

CPU tests force tokamax (which runs its XLA path here) to check the calls
through it; the `gpu` tests compare the fused kernels with the reference on
a GPU in bf16 and fp32.
"""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import kernels
from cascade_jax import model
from cascade_jax import ops
from cascade_jax import train
from cascade_jax.kernels import _build
from cascade_jax.ops import _attention
from cascade_jax.ops import _cpu
from cascade_jax.ops import _registry

gpu = pytest.mark.skipif(jax.default_backend() != 'gpu', reason='needs a GPU')


# --- selection ---------------------------------------------------------------


def test_forcing_is_checked_and_recorded():
  with pytest.raises(ValueError, match='unknown op'):
    ops.configure(flash='xla')
  with pytest.raises(ValueError, match="no implementation 'cuda'"):
    ops.parse('attention=cuda')
  with pytest.raises(ValueError, match='not op=implementation'):
    ops.parse('attention')
  assert ops.parse(' attention=xla, argmax=auto ') == dict(attention='xla',
                                                           argmax='auto')
  q = jnp.ones((1, 4, 2, 8))
  mask = jnp.tril(jnp.ones((4, 4), bool))[None]
  # Forced to something that cannot run here: an error naming why, never a
  # silent fallback.
  with ops.forced(attention='cudnn'):
    with pytest.raises(ValueError, match='needs a GPU'):
      ops.attention(q, q, q, scale=1.0, mask_bts=mask)
  ops.reset_selected()
  ops.attention(q, q, q, scale=1.0, mask_bts=mask)
  assert ops.selected() == {'attention': ['xla (cpu, float32)']}


def test_cascade_config_forces_ops(monkeypatch, tmp_path):
  from configs import cascade as cascade_config  # pylint: disable=g-import-not-at-top
  from cascade_jax.cascade import _run  # pylint: disable=g-import-not-at-top
  c = cascade_config.get_config('quick')
  assert c.ops == ''
  c.ops = 'attention=tokamax'
  got = {}
  monkeypatch.setattr(ops, 'configure', lambda **kw: got.update(kw))
  monkeypatch.setattr(_run, 'eval_sets', lambda c: {})
  monkeypatch.setattr(_run, 'plan', lambda c: [])   # no stage runs
  assert _run.run(c, str(tmp_path)) == []
  assert got == {'attention': 'tokamax'}
  c.ops = 'attention=flash'
  with pytest.raises(ValueError, match="no implementation 'flash'"):
    _run.run(c, str(tmp_path))


def test_strict_mode_makes_a_fallback_an_error(monkeypatch):
  # As on a TPU: the grouped matmul's kernel refuses 100 rows (not a
  # multiple of its tile), splash a general mask. Strict: an error naming
  # the op, the shape and the reason; otherwise XLA runs, recorded.
  monkeypatch.setattr(_registry, 'backend', lambda: 'tpu')
  lhs, rhs = jnp.ones((100, 8)), jnp.ones((2, 8, 4))
  sizes = jnp.array([60, 40])
  with ops.strict_mode():
    with pytest.raises(ops.FallbackError,
                       match=r"grouped_matmul would fall back from 'tokamax' "
                             r"to 'xla' on tpu for lhs \(100, 8\).*100 rows "
                             r"are not a multiple of the kernel's row tile"):
      ops.grouped_matmul(lhs, rhs, sizes)
    q = jnp.ones((1, 4, 2, 8))
    with pytest.raises(ops.FallbackError, match='splash takes segment ids'):
      ops.attention(q, q, q, scale=1.0,
                    mask_bts=jnp.tril(jnp.ones((4, 4), bool))[None])
  assert not ops.strict()
  ops.reset_selected()
  out = ops.grouped_matmul(lhs, rhs, sizes)
  np.testing.assert_allclose(out, 8.0)
  assert ops.selected() == {'grouped_matmul': ['xla (tpu, float32)']}
  # Buffers sized for the kernel: a multiple of its tile there, any size here.
  assert ops.round_rows(100) == 128 and ops.row_tile() == 128
  monkeypatch.setattr(_registry, 'backend', lambda: 'cpu')
  assert ops.round_rows(100) == 100


def test_strict_mode_on_the_cpu_runs_the_default_model():
  # Nothing falls back on the CPU: the CPU kernels are measured speed-ups,
  # XLA without them is not a fallback. The main job's model, forward and
  # gradient, through the default dispatch.
  cfg = train.model_config('small', dict(vocab_size=64))
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  toks = jnp.ones((2, 12), jnp.int32)
  with ops.strict_mode():   # the picks are made as it traces
    grads = nnx.jit(nnx.grad(lambda m: jnp.mean(m(toks)[0])))(m)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(nnx.state(grads)))


def test_strict_mode_from_the_environment_and_the_cascade_config(
    monkeypatch, tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  out = subprocess.run(
      [sys.executable, '-c', 'from cascade_jax import ops; print(ops.strict())'],
      env={**__import__('os').environ, 'CASCADE_JAX_OPS_STRICT': '1'},
      capture_output=True, text=True, check=True).stdout
  assert out.strip() == 'True'
  from configs import cascade as cascade_config  # pylint: disable=g-import-not-at-top
  from cascade_jax.cascade import _run  # pylint: disable=g-import-not-at-top
  c = cascade_config.get_config('quick')
  assert c.ops_strict is False
  c.ops_strict = True
  got = []
  monkeypatch.setattr(ops, 'set_strict', got.append)
  monkeypatch.setattr(_run, 'eval_sets', lambda c: {})
  monkeypatch.setattr(_run, 'plan', lambda c: [])
  _run.run(c, str(tmp_path))
  assert got == [True]


def test_attention_padded_to_splash_blocks_is_unchanged():
  # What splash's padding does to a learner's odd length (13 -> 16 here,
  # 10,239 -> 10,240 at the recipe's): padded keys are segment 0, seen by
  # no real query; the real queries' outputs are unchanged (the XLA
  # reference on both, since splash needs a TPU).
  q, k, v, seg, pos = _packed(t=13)
  kw = dict(scale=16 ** -0.5)
  ref = ops.attention(q, k, v, segment_ids=(seg, seg), positions=(pos, pos),
                      **kw)
  qp, segp = _attention.pad_to_block(q, seg, 8)
  kp, _ = _attention.pad_to_block(k, seg, 8)
  vp, _ = _attention.pad_to_block(v, seg, 8)
  posp, _ = _attention.pad_to_block(pos, seg, 8)
  assert qp.shape[1] == 16
  got = ops.attention(qp, kp, vp, segment_ids=(segp, segp),
                      positions=(posp, posp), **kw)[:, :13]
  real = np.asarray(seg) != 0
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real],
                             atol=1e-6)


# --- grouped matmul ----------------------------------------------------------


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_grouped_matmul_through_tokamax_equals_xla(dtype):
  rng = np.random.RandomState(0)
  lhs = jnp.asarray(rng.randn(40, 16), dtype)
  rhs = jnp.asarray(rng.randn(4, 16, 8), dtype)
  sizes = jnp.array([10, 0, 17, 9], jnp.int32)   # 4 rows past the groups

  def f(lhs, rhs):
    y = ops.grouped_matmul(lhs, rhs, sizes)
    return jnp.sum(jnp.sin(y.astype(jnp.float32))), y
  outs = {}
  for impl in ('xla', 'tokamax'):
    with ops.forced(grouped_matmul=impl):
      outs[impl] = jax.jit(jax.value_and_grad(f, argnums=(0, 1),
                                              has_aux=True))(lhs, rhs)
  (l0, y0), g0 = outs['xla']
  (l1, y1), g1 = outs['tokamax']
  np.testing.assert_array_equal(np.asarray(y1[36:], np.float32), 0)
  chex.assert_trees_all_close((y1, g1), (y0, g0), atol=1e-5, rtol=1e-5)


def test_a_tokamax_that_cannot_zero_the_rows_past_the_groups_is_not_picked(
    monkeypatch):
  # Without zero_initialize, tokamax's GPU kernels leave the rows past the
  # groups as memory was: NaN expert gradients on an H200 for a batch with
  # padding. On an accelerator such a tokamax is passed over, by name.
  from cascade_jax.ops import _matmul  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(_registry, 'backend', lambda: 'gpu')
  monkeypatch.setattr(_matmul, '_zero_initializes', lambda: False)
  lhs, rhs = jnp.ones((128, 8)), jnp.ones((2, 8, 4))
  sizes = jnp.array([60, 60], jnp.int32)
  ops.reset_selected()
  ops.grouped_matmul(lhs, rhs, sizes)
  assert ops.selected()['grouped_matmul'] == ['xla (gpu, float32)']
  with ops.strict_mode(), pytest.raises(ops.FallbackError,
                                        match='zero_initialize'):
    ops.grouped_matmul(lhs, rhs, sizes)
  ops.reset_selected()


def test_tpu_grouped_matmul_gives_tokamax_tiles_that_read_weights_less_often(
    monkeypatch):
  # On a TPU the grouped matmul hands tokamax's kernel 512-row tiles with k
  # and n whole up to 1,024 (its default, 128 x 128 x 128 for a shape
  # outside its tuned table, re-reads each expert's weights every 128 rows);
  # a shape that is not in 128s keeps tokamax's own choice. The kernel
  # itself runs only on a TPU: the call is captured here.
  from cascade_jax.ops import _matmul  # pylint: disable=g-import-not-at-top
  assert _matmul.tpu_tiles(262144, 2048, 768) == (512, 512, 768)
  assert _matmul.tpu_tiles(262144, 768, 2048) == (512, 768, 1024)
  assert _matmul.tpu_tiles(384, 2688, 1856) is None
  assert _matmul.tpu_tiles(384, 2688, 1920) == (128, 128, 128)
  assert _matmul.tpu_tiles(1024, 1024, 3072) == (512, 1024, 1024)
  tokamax = _attention.tokamax_module()
  seen = []
  monkeypatch.setattr(_registry, 'backend', lambda: 'tpu')
  monkeypatch.setattr(tokamax, 'ragged_dot', lambda *a, implementation=None,
                      **k: seen.append(implementation) or jnp.zeros(
                          (a[0].shape[0], a[1].shape[2]), jnp.float32))
  sizes = jnp.array([300, 212], jnp.int32)
  ops.grouped_matmul(jnp.ones((512, 2048)), jnp.ones((2, 2048, 768)), sizes)
  tiles = lambda op: (op.config.tile_m, op.config.tile_k, op.config.tile_n)
  assert tiles(seen[-1]) == (512, 512, 768)
  # And its backward's: d lhs contracts n (768), d rhs the rows.
  assert tiles(seen[-1].vjp.keywords['dlhs_ragged_dot']) == (512, 768, 1024)
  assert tiles(seen[-1].vjp.keywords['drhs_ragged_dot']) == (512, 512, 768)
  with ops.strict_mode():
    ops.grouped_matmul(jnp.ones((384, 256)), jnp.ones((2, 256, 200)),
                       jnp.array([100, 100], jnp.int32))
  assert seen[-1] == 'mosaic'        # not in 128s: tokamax's own tiles
  ops.reset_selected()


@pytest.mark.parametrize('impl', ['xla', 'tokamax'])
def test_ragged_moe_equals_dense_forward_and_grads(impl):
  # The dropless `ragged` dispatch over each grouped-matmul implementation:
  # the dense reference's outputs and gradients.
  def run(dispatch):
    cfg = model.tiny(pattern='E', moe=model.MoEConfig(
        num_experts=8, top_k=2, expert_dim=16, dispatch=dispatch))
    m = model.MoE(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 12, 16))

    def loss(m, x):
      y, info = m(x)
      return jnp.mean(jnp.square(y)) + info['aux_loss']
    return nnx.value_and_grad(loss, argnums=(0, 1))(m, x)
  l0, (gm0, gx0) = run('dense')
  with ops.forced(grouped_matmul=impl):
    l1, (gm1, gx1) = run('ragged')
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  np.testing.assert_allclose(gx1, gx0, atol=1e-6)
  chex.assert_trees_all_close(nnx.state(gm1, nnx.Param),
                              nnx.state(gm0, nnx.Param), atol=1e-6)


# --- attention ---------------------------------------------------------------


def _packed(b=2, t=16, n=4, k=2, h=16, dtype='float32', seed=0):
  """GQA inputs over packed rows: segments of uneven length and padding (0)."""
  rng = np.random.RandomState(seed)
  q = jnp.asarray(rng.randn(b, t, n, h), dtype)
  kk = jnp.asarray(rng.randn(b, t, k, h), dtype)
  v = jnp.asarray(rng.randn(b, t, k, h), dtype)
  seg = np.zeros((b, t), np.int32)
  seg[0, :5], seg[0, 5:13] = 1, 2                      # 3 padding at the end
  seg[1, :] = 1
  seg[1, 9:] = 2
  pos = np.zeros((b, t), np.int32)
  for r in range(b):
    for s_id in set(seg[r]) - {0}:
      idx = np.where(seg[r] == s_id)[0]
      pos[r, idx] = np.arange(len(idx))
  return q, kk, v, jnp.asarray(seg), jnp.asarray(pos)


@pytest.mark.parametrize('dtype, tol', [('float32', 1e-5), ('bfloat16', 2e-2)])
def test_attention_through_tokamax_equals_xla(dtype, tol):
  q, k, v, seg, pos = _packed(dtype=dtype)
  kw = dict(scale=16 ** -0.5, segment_ids=(seg, seg), positions=(pos, pos))
  with ops.forced(attention='xla'):
    ref = ops.attention(q, k, v, **kw)
  with ops.forced(attention='tokamax'):
    got = ops.attention(q, k, v, **kw)
  real = np.asarray(seg) != 0
  np.testing.assert_allclose(np.asarray(got, np.float32)[real],
                             np.asarray(ref, np.float32)[real],
                             atol=tol, rtol=tol)


def test_model_attention_goes_through_ops():
  cfg = model.tiny()
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  toks = jnp.ones((2, 8), jnp.int32)
  ops.reset_selected()
  ref, _ = m(toks)
  with ops.forced(attention='tokamax'):
    got, _ = nnx.jit(lambda m, t: m(t))(m, toks)
  np.testing.assert_allclose(got, ref, atol=1e-5)
  assert ops.selected()['attention'] == ['tokamax (cpu, float32)',
                                         'xla (cpu, float32)']


# --- the CPU kernels' policy -------------------------------------------------


def test_cpu_kernel_modes(monkeypatch):
  for value, want in (('', 'auto'), ('auto', 'auto'), ('1', 'on'),
                      ('0', 'off'), ('off', 'off')):
    monkeypatch.setenv(_cpu.ENV, value)
    assert _cpu.mode() == want
  monkeypatch.setenv(_cpu.ENV, 'sometimes')
  with pytest.raises(ValueError, match='CASCADE_JAX_CPU_KERNELS'):
    _cpu.mode()
  monkeypatch.setenv(_cpu.ENV, '0')
  assert _cpu.kernel_enabled('argmax') == 'CASCADE_JAX_CPU_KERNELS=0'
  with pytest.raises(ValueError, match='no CPU kernel'):
    _cpu.kernel_enabled('attention')


@pytest.mark.parametrize('index, t', [(0, 1), (700, 1), (1535, 1),
                                      (1020, 7), (0, 300)])
def test_cache_attention_reads_the_written_blocks_only(index, t):
  # The decode path over a long cache reads only the blocks written so far
  # (a loop with a dynamic trip count): equal to reading the whole cache,
  # for tokens that see a slot; slots past the written ones hold garbage
  # that must not leak in.
  b, n, kh, h, s = 3, 4, 2, 16, 2048
  ks = jax.random.split(jax.random.key(index + t), 6)
  q = jax.random.normal(ks[0], (b, t, n, h))
  kn = jax.random.normal(ks[1], (b, t, kh, h))
  vn = jax.random.normal(ks[2], (b, t, kh, h))
  ck = jax.random.normal(ks[3], (b, kh, h, s)) * 100     # garbage beyond
  cv = jax.random.normal(ks[4], (b, kh, s, h)) * 100
  slot = jnp.arange(s)
  pos = index + jnp.arange(t)
  # Causal over the written slots; row 1 starts 40 slots later (left
  # padding); row 2's last token is padding and sees nothing.
  start = jnp.array([0, 40, 0])[:, None, None]
  mask = (slot[None, None] <= pos[None, :, None]) & (
      slot[None, None] >= start)
  mask = mask.at[2, -1].set(False)
  assert _attention.written_blocks_ok(s) is True
  want = _attention._cache_xla(q, kn, vn, ck, cv, mask, index, h ** -0.5)
  got = jax.jit(_attention._cache_written, static_argnums=(7,))(
      q, kn, vn, ck, cv, mask, index, h ** -0.5)
  sees = np.asarray(mask.any(-1))                      # [B, T]
  assert sees.any() and not sees.all()
  np.testing.assert_allclose(np.asarray(got[0])[sees],
                             np.asarray(want[0])[sees], atol=2e-5, rtol=1e-5)
  assert float(np.abs(np.asarray(got[0])[~sees]).max()) == 0.0
  for a, w in zip(got[1:], want[1:]):
    np.testing.assert_array_equal(a, w)
  # Short caches and caches off the block are read whole (not a fallback).
  assert isinstance(_attention.written_blocks_ok(1024), _registry.Elsewhere)
  assert isinstance(_attention.written_blocks_ok(2100), _registry.Elsewhere)


@pytest.mark.skipif(_build._library() is None,
                    reason='the CPU kernels cannot be built here')
def test_calibration_is_measured_once_and_decides(monkeypatch, tmp_path,
                                                  capsys):
  # A kernel runs in 'auto' only where the cached calibration says it is
  # faster; the file is written once and then read (a resumed run decides
  # as the killed one did).
  monkeypatch.setenv(_cpu.ENV, 'auto')
  path = tmp_path / 'calibration.json'
  monkeypatch.setattr(kernels, 'cache_path', lambda suffix: path)
  calls = []
  verdicts = {'moe_decode': True, 'cache_attention': False, 'argmax': False}

  def fake_measure():
    # Never inside the trace that asked (the sampler's): arrays are concrete.
    assert not isinstance(jnp.ones(1) + 1, jax.core.Tracer)
    calls.append(1)
    return {op: dict(use=use, kernel_us=[1.0], xla_us=[2.0 if use else 0.5],
                     sizes=[8]) for op, use in verdicts.items()}
  monkeypatch.setattr(_cpu, '_measure', fake_measure)
  _cpu.calibration.cache_clear()
  try:
    asked = []
    jax.jit(lambda x: asked.append(_cpu.kernel_enabled('moe_decode')) or x)(1.0)
    assert asked == [True]
    assert 'slower than XLA' in _cpu.kernel_enabled('argmax')
    assert json.loads(path.read_text())['argmax']['use'] is False
    assert 'calibrated in' in capsys.readouterr().out
    _cpu.calibration.cache_clear()
    assert _cpu.kernel_enabled('moe_decode') is True
    assert '[cached' in capsys.readouterr().out
    assert len(calls) == 1
    # Forcing a kernel through ops overrides the calibration (benchmarks).
    with ops.forced(argmax='cpu_kernel'):
      assert _cpu.kernel_enabled('argmax') is True
  finally:
    _cpu.calibration.cache_clear()


@pytest.mark.skipif(_build._library() is None,
                    reason='the CPU kernels cannot be built here')
def test_calibration_times_the_samplers_step_with_each_subset(monkeypatch):
  # The calibration decides on the sampler's decode step of the main job's
  # model: each timed function runs exactly the kernels it names (their FFI
  # calls in its compiled program, the others' absent), and its traces are
  # not recorded as what the run ran.
  monkeypatch.setenv(_cpu.ENV, 'auto')
  monkeypatch.setattr(_cpu, 'calibration', lambda: pytest.fail(
      'the calibration asked for itself'))
  from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
  assert rollout.main_job_model().cfg.vocab_size == 1024   # registered
  targets = dict(moe_decode='cascade_jax_moe_ffn',
                 cache_attention='cascade_jax_cache_attention',
                 argmax='cascade_jax_argmax')
  ops.reset_selected()
  _cpu._CALIBRATING.set()
  try:
    with _registry.unrecorded():
      for on in (frozenset(), frozenset({'moe_decode', 'argmax'}),
                 frozenset({'cache_attention'})):
        fn, args = _cpu._decode_steps(8, on)
        text = fn.lower(*args).as_text()
        assert {op for op, t in targets.items() if t in text} == on
  finally:
    _cpu._CALIBRATING.clear()
  assert ops.selected() == {}


def test_fused_kernels_get_lengths_padded_to_their_block():
  # cuDNN refuses odd masked lengths in training (seen on an H200): the GPU
  # kernels run on T, S padded to FUSED_BLOCK. Through the reference kernel,
  # the padded call equals the unpadded one, values and gradients.
  q, k, v, seg, pos = _packed(b=2, t=23, n=4, k=2, h=16)
  mask = _attention.attention_mask(pos, seg, pos, seg)
  seen = []

  def kernel(q, k, v, m, scale):
    seen.append((q.shape[1], k.shape[1], m.shape))
    return _attention._xla(q, k, v, m, scale)

  def run(pad):
    def loss(q, k, v):
      out = (_attention._padded(kernel, q, k, v, mask, 0.25, block=16) if pad
             else _attention._xla(q, k, v, mask, 0.25))
      return jnp.sum(jnp.where((seg != 0)[:, :, None, None], out, 0) ** 2), out
    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  (_, got), g_got = run(True)
  (_, ref), g_ref = run(False)
  assert seen == [(32, 32, (2, 32, 32))] and got.shape == ref.shape
  real = np.asarray(seg) != 0
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real],
                             atol=1e-6)
  chex.assert_trees_all_close(g_got, g_ref, atol=1e-5, rtol=1e-5)


# --- on a GPU ----------------------------------------------------------------


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize('impl', ['cudnn', 'tokamax'])
@pytest.mark.parametrize('dtype, tol', [('bfloat16', 2e-2), ('float32', 2e-3)])
def test_gpu_attention_equals_xla(impl, dtype, tol):
  if impl == 'cudnn' and dtype == 'float32':
    pytest.skip('cuDNN flash attention is bf16 / fp16 only')
  q, k, v, seg, pos = _packed(b=4, t=256, n=8, k=2, h=64, dtype=dtype)
  kw = dict(scale=64 ** -0.5, segment_ids=(seg, seg), positions=(pos, pos))

  def loss(q, k, v):
    out = ops.attention(q, k, v, **kw)
    real = (seg != 0)[:, :, None, None]
    return jnp.sum(jnp.where(real, out, 0).astype(jnp.float32) ** 2), out
  res = {}
  for name in ('xla', impl):
    with ops.forced(attention=name):
      res[name] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2),
                                             has_aux=True))(q, k, v)
  (_, ref), gref = res['xla']
  (_, got), ggot = res[impl]
  real = np.asarray(seg) != 0
  np.testing.assert_allclose(np.asarray(got, np.float32)[real],
                             np.asarray(ref, np.float32)[real], atol=tol,
                             rtol=tol)
  for a, b in zip(ggot, gref):
    np.testing.assert_allclose(np.asarray(a, np.float32),
                               np.asarray(b, np.float32), atol=5 * tol,
                               rtol=5 * tol)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize('dtype, tol', [('bfloat16', 3e-2), ('float32', 1e-4)])
def test_gpu_ragged_moe_equals_dense(dtype, tol):
  def run(dispatch, impl):
    cfg = model.tiny(pattern='E', embed_dim=128, dtype=dtype,
                     moe=model.MoEConfig(num_experts=8, top_k=2,
                                         expert_dim=128, dispatch=dispatch))
    m = model.MoE(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (4, 256, 128), dtype)

    def loss(m, x):
      y, _ = m(x)
      return jnp.mean(jnp.square(y.astype(jnp.float32)))
    with ops.forced(grouped_matmul=impl):
      return nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))(m, x)
  l0, (gm0, gx0) = run('dense', 'xla')
  ops.reset_selected()
  l1, (gm1, gx1) = run('ragged', 'tokamax')
  assert ops.selected()['grouped_matmul'] == [f'tokamax (gpu, {dtype})']
  np.testing.assert_allclose(l1, l0, rtol=tol)
  np.testing.assert_allclose(np.asarray(gx1, np.float32),
                             np.asarray(gx0, np.float32), atol=tol, rtol=tol)
  chex.assert_trees_all_close(nnx.state(gm1, nnx.Param),
                              nnx.state(gm0, nnx.Param), atol=tol, rtol=tol)


def _gpu_preset(name: str) -> model.ModelConfig:
  """A 30B preset's own flags (dispatch, routing, activations, dtypes), at a
  size a GPU test compiles in seconds."""
  small = dict(vocab_size=1024, embed_dim=256, num_heads=4, num_kv_heads=2,
               head_dim=64)
  if name == 'qwen3':
    return model.qwen3_30b_a3b(pattern='*E' * 2, **small).replace_moe(
        num_experts=16, top_k=4, expert_dim=128)
  return model.nemotron3_nano_30b_a3b(pattern='MEM*E', **small).replace_moe(
      num_experts=16, top_k=4, expert_dim=128,
      shared_expert_dim=256).replace_mamba(num_heads=8, head_dim=32,
                                           state_dim=64, num_groups=2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize('preset', ['qwen3', 'nemotron'])
def test_gpu_strict_learner_step_at_an_rl_length(preset):
  """The learner's forward and backward at an RL length (prompt 128 +
  response 256 - 1 = 383, two packed rollouts a row and padding), strict:
  every op takes its fused kernel (an error otherwise) and the loss and
  gradient equal the XLA reference's."""
  cfg = _gpu_preset(preset)
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  b, t = 4, 383
  rng = np.random.RandomState(0)
  toks = jnp.asarray(rng.randint(1, cfg.vocab_size, (b, t + 1)), jnp.int32)
  seg = np.ones((b, t + 1), np.int32)
  seg[:, 200:] = 2
  seg[1, 350:] = 0                                    # padding
  pos = np.zeros_like(seg)
  for r in range(b):
    for s_id in set(seg[r]) - {0}:
      idx = np.where(seg[r] == s_id)[0]
      pos[r, idx] = np.arange(len(idx))
  seg, pos = jnp.asarray(seg), jnp.asarray(pos)
  real = (seg[:, 1:] != 0) & (seg[:, 1:] == seg[:, :-1])

  def loss(m):
    logits, info = m(toks[:, :-1], positions_bt=pos[:, :-1],
                     segment_ids_bt=seg[:, :-1])
    lp = ops.token_logprobs(logits, toks[:, 1:])
    return -jnp.sum(jnp.where(real, lp, 0)) / jnp.sum(real)

  step = lambda: nnx.jit(nnx.value_and_grad(loss))(m)
  ops.reset_selected()
  with ops.strict_mode():
    l_fast, g_fast = step()
  picked = ops.selected()
  assert picked['attention'] == ['cudnn (gpu, bfloat16)'], picked
  assert picked['grouped_matmul'] == ['tokamax (gpu, bfloat16)'], picked
  with ops.forced(attention='xla', grouped_matmul='xla'):
    l_ref, g_ref = step()
  np.testing.assert_allclose(float(l_fast), float(l_ref), rtol=2e-2)
  flat = lambda g: np.concatenate([np.asarray(x, np.float32).ravel() for x in
                                   jax.tree.leaves(nnx.state(g, nnx.Param))])
  a, r = flat(g_fast), flat(g_ref)
  cos = float(a @ r / (np.linalg.norm(a) * np.linalg.norm(r)))
  assert cos > 0.99, cos
  assert abs(np.linalg.norm(a) / np.linalg.norm(r) - 1) < 0.05
