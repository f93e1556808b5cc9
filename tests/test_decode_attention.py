"""The Pallas TPU decode attention (`cache_attention='pallas'`), run in Pallas' interpreter on the CPU.

On a TPU it is the sampler's cache attention ('auto'); here it runs only
when forced, interpreted: the kernel's logic (the written blocks, the
online softmax, the masks, the per-row write index of continuous batching)
against the XLA formulation, in the sampler's default path.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import kernels
from cascade_jax import model
from cascade_jax import ops
from cascade_jax import rollout
from cascade_jax.ops import _attention
from cascade_jax.ops import _registry


def _reference(q_bkmh, keys, values, mask_bms, scale):
  logits = jnp.einsum('bkmh,bkhs->bkms', q_bkmh.astype(jnp.float32),
                      keys.astype(jnp.float32)) * scale
  seen = jnp.broadcast_to(mask_bms[:, None] != 0, logits.shape)
  logits = jnp.where(seen, logits, -jnp.inf)
  top = jnp.max(logits, -1, keepdims=True)
  p = jnp.where(seen, jnp.exp(logits - jnp.where(jnp.isfinite(top), top, 0)),
                0.0)
  total = p.sum(-1, keepdims=True)
  probs = jnp.where(total > 0, p / jnp.where(total > 0, total, 1), 0)
  return jnp.einsum('bkms,bksh->bkmh', probs, values.astype(jnp.float32))


@pytest.mark.parametrize('dtype,rows', [('float32', 1), ('float32', 3),
                                        ('bfloat16', 1)])
def test_pallas_decode_attention_reads_only_written_blocks_and_equals_the_reference(
    dtype, rows):
  b, kh, g, h, s, block = 4, 2, 4, 16, 512, 128
  m = rows * g
  rng = np.random.default_rng(0)
  dt = jnp.dtype(dtype)
  q = jnp.asarray(rng.normal(size=(b, kh, m, h)), dt)
  keys = jnp.asarray(rng.normal(size=(b, kh, h, s)), dt)
  values = jnp.asarray(rng.normal(size=(b, kh, s, h)), dt)
  # Rows written to 3, 130 (a block and a bit), 300 and every slot; row 1
  # hides a slot in the middle.
  written = jnp.asarray([3, 130, 300, 512], jnp.int32)
  mask = jnp.arange(s)[None] < written[:, None]
  mask = mask.at[1, 7].set(False)
  mask_bms = jnp.broadcast_to(mask[:, None], (b, m if rows > 1 else 1, s))
  mask_bms = mask_bms.astype(jnp.int32)
  want = _reference(q, keys, values, mask_bms, h ** -0.5)
  got = kernels.decode_attention(q, keys, values, mask_bms, written,
                                 scale=h ** -0.5, block=block, interpret=True)
  assert got.dtype == dt and got.shape == q.shape
  np.testing.assert_allclose(np.asarray(got, np.float32), want,
                             atol=1e-5 if dtype == 'float32' else 2e-2)
  # Only the written blocks are read: garbage past them changes nothing
  # (the mask hides them; a read of a NaN would still poison the sums).
  junk = jnp.arange(s)[None, None, None, :] >= (
      -(-written // block) * block)[:, None, None, None]
  again = kernels.decode_attention(
      q, jnp.where(junk, jnp.nan, keys),
      jnp.where(jnp.swapaxes(junk, 2, 3), jnp.nan, values), mask_bms, written,
      scale=h ** -0.5, block=block, interpret=True)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(got))
  # A row that sees no slot gets zeros, not NaN.
  none = kernels.decode_attention(q, keys, values, jnp.zeros_like(mask_bms),
                                  written, scale=h ** -0.5, block=block,
                                  interpret=True)
  np.testing.assert_array_equal(np.asarray(none, np.float32), 0.0)


def test_pallas_decode_attention_blocks_and_refusals():
  assert kernels.decode_attention_block(10240) == 512
  assert kernels.decode_attention_block(384) == 128
  assert kernels.decode_attention_block(100) is None
  with ops.forced(cache_attention='pallas'):
    assert ops.cache_slots(100) == 128       # rounded up to its blocks
  assert ops.cache_slots(100) == 100         # CPU 'auto': as asked
  # Not a TPU: 'elsewhere', whatever the shape (strict mode passes it by).
  for slots in (512, 100):
    why = _attention._pallas_ok(jnp.zeros((1, 2, 4, slots)),  # pylint: disable=protected-access
                                jnp.zeros((1, 1, 4, 4)))
    assert isinstance(why, _registry.Elsewhere), why
  with ops.forced(cache_attention='pallas'):
    why = _attention._pallas_ok(jnp.zeros((1, 2, 4, 100)),  # pylint: disable=protected-access
                                jnp.zeros((1, 1, 4, 4)))
    assert 'blocks' in why


def _small():
  cfg = model.small(vocab_size=64, pattern='*E', embed_dim=32, num_heads=4,
                    num_kv_heads=2, head_dim=16)
  return model.Transformer(cfg, rngs=nnx.Rngs(0))


def test_sampler_with_pallas_cache_attention_samples_what_xla_samples():
  # The main job's sampler path (the `small` preset's capacity dispatch,
  # fp32, temperature 1), its prefill and decode attention forced to the
  # kernel: the same draws; the cache grows to the kernel's blocks.
  m = _small()
  prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16]]
  sc = rollout.SampleConfig(max_new_tokens=20, temperature=1.0)
  draws = {}
  for impl in ('xla', 'pallas'):
    ops.reset_selected()
    jax.clear_caches()    # a choice takes effect at the next trace
    with ops.forced(cache_attention=impl):
      draws[impl] = rollout.generate(m, prompts, cfg=sc, stop_ids=1,
                                     key=jax.random.key(1))
    assert ops.selected()['cache_attention'] == [f'{impl} (cpu, float32)']
  np.testing.assert_array_equal(draws['pallas'].tokens, draws['xla'].tokens)
  np.testing.assert_allclose(draws['pallas'].logprobs, draws['xla'].logprobs,
                             atol=1e-5)


def test_strict_sampler_on_the_cpu_is_not_a_fallback_from_the_tpu_kernel():
  # Strict mode (the plan's) on the CPU: a cache that is no multiple of
  # the kernel's blocks (here 5 + 20 slots) is not a fallback from it.
  m = _small()
  sc = rollout.SampleConfig(max_new_tokens=20, temperature=1.0)
  jax.clear_caches()
  with ops.strict_mode():
    out = rollout.generate(m, [[3, 4, 5, 6, 7]], cfg=sc, stop_ids=1,
                           key=jax.random.key(1))
  assert out.tokens.shape == (1, 20)


@pytest.mark.slow  # ~17 s, the TPU kernel in Pallas' interpreter (the sampler's draws with it: test_sharding's inference-layout test): CI runs it
def test_continuous_batching_with_pallas_cache_attention_samples_what_xla_samples():
  # Continuous batching writes a slot a row (`index` [B]): each row reads
  # its own written blocks.
  m = _small()
  prompts = [[3 + i % 7] * (1 + i % 5) for i in range(10)]
  sc = rollout.SampleConfig(max_new_tokens=12, temperature=1.0)
  keys = jax.random.split(jax.random.key(2), len(prompts))
  draws = {}
  for impl in ('xla', 'pallas'):
    ops.reset_selected()
    jax.clear_caches()    # a choice takes effect at the next trace
    with ops.forced(cache_attention=impl):
      draws[impl] = rollout.generate_continuous(
          m, prompts, cfg=sc, stop_ids=(1, 2), slots=4, keys=keys)
    assert ops.selected()['cache_attention'] == [f'{impl} (cpu, float32)']
  np.testing.assert_array_equal(draws['pallas'].tokens, draws['xla'].tokens)
  np.testing.assert_allclose(draws['pallas'].logprobs, draws['xla'].logprobs,
                             atol=1e-5)


def test_prefill_through_the_pallas_cache_attention_keeps_kv_heads_split():
  # The prefill's 'cache' path (the CPU's choice, and continuous batching's
  # on a TPU) hands the kv heads' mesh axes to the kernel's shard_map: on a
  # batch x tensor mesh with the cache's kv heads split over `tensor`,
  # nothing is gathered; the values equal the one-device call's.
  from cascade_jax import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(dict(data=4, tensor=2))
  b, t, kh, g, h, s = 4, 3, 2, 2, 16, 128
  rng = np.random.default_rng(1)
  f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  q, k, v = f32(b, t, kh * g, h), f32(b, t, kh, h), f32(b, t, kh, h)
  ck, cv = jnp.zeros((b, kh, h, s)), jnp.zeros((b, kh, s, h))
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  seg = jnp.ones((b, t), jnp.int32)
  mask = ops.attention_mask(pos, seg, jnp.where(jnp.arange(s) < t,
                                                jnp.arange(s), 0)[None],
                            (jnp.arange(s) < t).astype(jnp.int32)[None])
  named = lambda *spec: jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(*spec))
  args = (jax.device_put(q, named('data', None, 'tensor')),
          jax.device_put(k, named('data', None, 'tensor')),
          jax.device_put(v, named('data', None, 'tensor')),
          jax.device_put(ck, named('data', 'tensor')),
          jax.device_put(cv, named('data', 'tensor')),
          jax.device_put(mask, named('data')))

  def prefill(*a, head_axes):
    return ops.prefill_attention(
        *a, jnp.int32(0), scale=h ** -0.5, segment_ids=seg, positions=pos,
        shard=(mesh, ('data',)), head_axes=head_axes)

  with ops.forced(prefill_attention='cache', cache_attention='pallas'):
    want = jax.jit(lambda *a: prefill(*a, head_axes=()))(*args)
    f = jax.jit(lambda *a: prefill(*a, head_axes=('tensor',)))
    got = f(*args)
    hlo = f.lower(*args).compile().as_text()
  for x, y in zip(got, want):
    np.testing.assert_allclose(x, y, atol=1e-5)
  assert 'all-gather' not in hlo
