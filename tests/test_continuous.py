"""Continuous batching: rows refilled as they end give the plain sampler's samples for the same per-row keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import model
from cascade_jax import rollout
import _mesh_helpers  # pylint: disable=g-import-not-at-top

STOP = (3, 5, 7, 9)   # rows end at many lengths
NEW = 12


def _prompts(n, seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(4, 48, k).tolist() for k in rng.randint(1, 14, n)]


def _fed(ref, prompts):
  """[R, P + N]: the positions whose routing the learner replays (the real
  prompt tokens, and every response token but the last)."""
  r, n = ref.mask.shape
  p = ref.expert_idx.shape[1] - n
  lens = np.asarray([len(x) for x in prompts])
  return np.concatenate([np.arange(p)[None] >= p - lens[:, None],
                         np.asarray(ref.mask)[:, 1:], np.zeros((r, 1))], 1)


def _assert_same_samples(ref, out, prompts):
  np.testing.assert_array_equal(out.mask, ref.mask)
  np.testing.assert_array_equal(out.tokens * out.mask, ref.tokens * ref.mask)
  np.testing.assert_array_equal(out.truncated, ref.truncated)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
  np.testing.assert_array_equal(out.kept * out.mask, ref.kept * ref.mask)
  if ref.expert_idx is not None:
    fed = _fed(ref, prompts)[..., None, None]
    np.testing.assert_array_equal(np.asarray(out.expert_idx) * fed,
                                  np.asarray(ref.expert_idx) * fed)


@pytest.mark.parametrize('preset,sample', [
    ('tiny', dict(temperature=1.0, top_p=0.9)),   # attention + MoE
    pytest.param('tiny', dict(temperature=0.0),   # greedy: CI
                 marks=pytest.mark.slow),
    pytest.param('small_hybrid', dict(temperature=1.0),   # Mamba-2 per row
                 marks=pytest.mark.slow),
])
def test_continuous_batching_equals_the_plain_sampler_per_row_keys(preset,
                                                                   sample):
  cfg = (model.tiny(vocab_size=48, pattern='*E*E') if preset == 'tiny' else
         model.small_hybrid(vocab_size=48))
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  prompts = _prompts(21)
  sc = rollout.SampleConfig(max_new_tokens=NEW, prompt_bucket=8, **sample)
  keys = jax.random.split(jax.random.key(3), len(prompts))
  ref = rollout.generate(m, prompts, cfg=sc, stop_ids=STOP, key=keys,
                         record_experts=True)
  stats = {}
  out = rollout.generate_continuous(m, prompts, cfg=sc, stop_ids=STOP,
                                    slots=4, keys=keys, record_experts=True,
                                    stats=stats, refill=1)
  _assert_same_samples(ref, out, prompts)
  lengths = np.asarray(ref.mask.sum(1))
  # Rows did end early and were refilled: 21 prompts through 4 slots.
  assert stats['refills'] > 5 and stats['row_steps'] == lengths.sum()
  # A step's rows are live ones: far fewer steps than 6 fixed batches of 4
  # (each as long as its longest row), never fewer than its rows need.
  fixed = sum(lengths[i:i + 4].max() for i in range(0, len(prompts), 4))
  # A row's first token comes with its prefill, the others one a step.
  assert (lengths - 1).sum() / 4 <= stats['steps'] <= fixed
  if sample['temperature'] > 0:
    assert len(set(lengths.tolist())) > 2      # the rows really differ


def _main_job_case(seed: int, n: int, new_tokens: int, **continuous):
  """The main job's sampler model (`small`, vocab 1024, fp32, its decode
  layouts), n prompts, several stop ids so rows end at many lengths: the
  plain sampler's samples and the continuous one's (`continuous`: its
  arguments, slots included), for the same keys."""
  m = rollout.main_job_model()
  rng = np.random.RandomState(seed)
  prompts = [rng.randint(40, 1024, k).tolist() for k in rng.randint(5, 30, n)]
  sc = rollout.SampleConfig(max_new_tokens=new_tokens, prompt_bucket=32,
                            temperature=1.0)
  stops = tuple(range(1, 40))
  keys = jax.random.split(jax.random.key(seed - 1), len(prompts))
  ref = rollout.generate(m, prompts, cfg=sc, stop_ids=stops, key=keys,
                         record_experts=True)
  out = rollout.generate_continuous(m, prompts, cfg=sc, stop_ids=stops,
                                    keys=keys, record_experts=True,
                                    **continuous)
  return prompts, ref, out


def test_continuous_batching_on_the_main_job_model():
  prompts, ref, out = _main_job_case(1, 24, 24, slots=8)
  _assert_same_samples(ref, out, prompts)
  assert len(set(np.asarray(ref.mask.sum(1)).tolist())) > 3


# CI; the default suite runs rl.prefill_rows reaching the episodes
# (test_episodes); the main job fills in one prefill.
@pytest.mark.slow
def test_continuous_prefill_in_chunks_samples_what_one_prefill_samples():
  # rl.prefill_rows: the first fill of 8 slots in prefills of at most 3
  # rows (3, 3, 2), the refills too; the same samples as the plain
  # sampler's for the same keys.
  stats = {}
  prompts, ref, out = _main_job_case(2, 14, 16, slots=8, prefill_rows=3,
                                     stats=stats)
  _assert_same_samples(ref, out, prompts)
  assert stats['max_prefill'] == 3 and stats['refills'] >= 5, stats
  with pytest.raises(ValueError, match='prefill_rows must be >= 0'):
    rollout.generate_continuous(rollout.main_job_model(), prompts,
                                cfg=rollout.SampleConfig(), stop_ids=1,
                                slots=8, prefill_rows=-1)


def test_per_row_keys_make_a_row_independent_of_its_neighbours():
  m = model.Transformer(model.tiny(vocab_size=48, pattern='*E*E'),
                        rngs=nnx.Rngs(0))
  prompts = _prompts(6, seed=2)
  sc = rollout.SampleConfig(max_new_tokens=NEW, prompt_bucket=16,
                            temperature=1.0)
  keys = jax.random.split(jax.random.key(5), 6)
  whole = rollout.generate(m, prompts, cfg=sc, stop_ids=-1, key=keys)
  part = rollout.generate(m, prompts[3:], cfg=sc, stop_ids=-1, key=keys[3:])
  np.testing.assert_array_equal(part.tokens, whole.tokens[3:])
  # One key for the batch: the rows' draws depend on the batch (so the
  # comparison above can fail).
  one = rollout.generate(m, prompts[3:], cfg=sc, stop_ids=-1,
                         key=jax.random.key(5))
  assert not np.array_equal(one.tokens, whole.tokens[3:])


def test_continuous_batching_refuses_bad_input():
  m = model.Transformer(model.tiny(vocab_size=48, pattern='*E'),
                        rngs=nnx.Rngs(0))
  sc = rollout.SampleConfig(max_new_tokens=4, prompt_bucket=8)
  prompts = _prompts(3)
  with pytest.raises(ValueError, match='one key a prompt'):
    rollout.generate_continuous(m, prompts, cfg=sc, stop_ids=STOP, slots=2,
                                keys=jax.random.split(jax.random.key(0), 2))
  with pytest.raises(ValueError, match='keys for 3 rows'):
    rollout.generate(m, prompts, cfg=sc, stop_ids=STOP,
                     key=jax.random.split(jax.random.key(0), 2))
  with pytest.raises(ValueError, match='slots must be'):
    rollout.generate_continuous(m, prompts, cfg=sc, stop_ids=STOP, slots=0)
  assert jnp.ndim(rollout.row_keys(jax.random.split(jax.random.key(0), 3),
                                   2)) == 1


# Not the main job's path (rl.sample_slots=0): slow; CI runs them.
@pytest.mark.slow
def test_continuous_batching_on_a_mesh_in_the_inference_layout():
  # The RL sampler on a pod: the weight sync's copy on an fsdp x expert
  # mesh (MoE layers decode through the mesh dispatch). 21 prompts through
  # 6 slots (rounded up to the 8 devices the rows split over), refilled one
  # row at a time (each prefill one row a device): every row is the
  # single-device sampler's for the same key, routing included.
  m = model.Transformer(_mesh_helpers.tiny_moe(48), rngs=nnx.Rngs(0))
  sm = _mesh_helpers.inference_layout_sampler(m, dict(fsdp=2, expert=4))
  assert sm.ctx.shards('batch') == 8
  prompts = _prompts(21)
  sc = rollout.SampleConfig(max_new_tokens=NEW, prompt_bucket=8,
                            temperature=1.0)
  keys = jax.random.split(jax.random.key(3), len(prompts))
  ref = rollout.generate(m, prompts, cfg=sc, stop_ids=STOP, key=keys,
                         record_experts=True)
  stats = {}
  out = rollout.generate_continuous(sm, prompts, cfg=sc, stop_ids=STOP,
                                    slots=6, keys=keys, record_experts=True,
                                    stats=stats, refill=1)
  _assert_same_samples(ref, out, prompts)
  assert stats['refills'] > 2, stats
  assert len(set(np.asarray(ref.mask.sum(1)).tolist())) > 2


@pytest.mark.slow
@pytest.mark.parametrize('mesh', [dict(data=8),
                                  dict(data=2, expert=2, tensor=2)])
def test_continuous_decode_on_a_mesh_keeps_each_rows_cache_on_its_device(
    mesh):
  # 16 rows start split over the batch devices (8, or 4 with the KV heads
  # over 'tensor'). In the decode loop between refills every row's KV cache
  # stays there: no collective moves a cache row (the cache's slot axis
  # appears in none; the loop exchanges tokens' routing, per-row scalars and
  # the tensor axis' partial sums). A refill of 8 rows moves those rows'
  # fresh caches to their devices, never the 16.
  import re  # pylint: disable=g-import-not-at-top
  from cascade_jax.rollout import _continuous  # pylint: disable=g-import-not-at-top
  cfg = model.tiny(vocab_size=48, pattern='*E*E')
  sm = _mesh_helpers.inference_layout_sampler(
      model.Transformer(cfg, rngs=nnx.Rngs(0)), mesh)
  graph, state = nnx.split(sm)
  b, k, p, n, r = 16, 8, 8, NEW, 21
  per_device = b // sm.ctx.shards('batch')
  rows = _continuous._new_rows(sm.ctx, cfg, b, p, n, False, 0)
  slots = rows.cache.max_len
  assert all(x.sharding.shard_shape(x.shape)[0] == per_device
             for x in jax.tree.leaves(rows) if x.size > 1), rows
  sc = rollout.SampleConfig(max_new_tokens=n, temperature=1.0)
  layouts = _continuous.decode_layouts(graph, state, b)

  def moved(compiled):
    """The shapes every collective of a compiled program moves."""
    return [tuple(int(x) for x in d.split(',') if x) for d in re.findall(
        r'= \w+\[([\d,]*)\][^ ]* (?:all-gather|all-to-all|collective-permute'
        r'|all-reduce|reduce-scatter)', compiled.as_text())]

  step = _continuous._decode_until.lower(
      graph, state, layouts, rows, jnp.asarray(1), cfg=sc,
      stop_ids=STOP).compile()
  shapes = moved(step)
  assert shapes and not [d for d in shapes if slots in d], shapes
  for x, y in zip(jax.tree.leaves(rows.cache),
                  jax.tree.leaves(step.output_shardings[0].cache)):
    assert y.shard_shape(x.shape)[0] == per_device, y
  out = _continuous._Out(
      toks=jnp.zeros((r, n), jnp.int32), lps=jnp.zeros((r, n)),
      kept=jnp.zeros((r, n), jnp.int32),
      experts=jnp.zeros((r, p + n, 0, 0), jnp.int32))
  rows_k = jnp.arange(k, dtype=jnp.int32)
  insert = _continuous._insert.lower(
      graph, state, layouts, rows, out, jnp.zeros((r, p), jnp.int32),
      jnp.ones((r,), jnp.int32), jax.random.split(jax.random.key(0), r),
      rows_k, 2 * rows_k, rows_k, cfg=sc, stop_ids=STOP, pad_id=0,
      record_experts=False).compile()
  cache_moves = [d for d in moved(insert) if slots in d]
  assert cache_moves and max(d[0] for d in cache_moves) == k, cache_moves
  for x, y in zip(jax.tree.leaves(rows.cache),
                  jax.tree.leaves(insert.output_shardings[0].cache)):
    assert y.shard_shape(x.shape)[0] == per_device, y
