"""Continuous batching: rows refilled as they end give the plain sampler's samples for the same per-row keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import model
from cascade_jax import rollout
from cascade_jax import sharding

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
    ('tiny', dict(temperature=0.0)),              # greedy
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


def test_continuous_batching_on_the_main_job_model():
  # The main job's sampler model (`small`, vocab 1024, fp32, its decode
  # layouts); several stop ids so rows end at many lengths.
  m = rollout.main_job_model()
  rng = np.random.RandomState(1)
  prompts = [rng.randint(40, 1024, k).tolist() for k in rng.randint(5, 30, 24)]
  sc = rollout.SampleConfig(max_new_tokens=24, prompt_bucket=32,
                            temperature=1.0)
  stops = tuple(range(1, 40))
  keys = jax.random.split(jax.random.key(0), len(prompts))
  ref = rollout.generate(m, prompts, cfg=sc, stop_ids=stops, key=keys,
                         record_experts=True)
  out = rollout.generate_continuous(m, prompts, cfg=sc, stop_ids=stops,
                                    slots=8, keys=keys, record_experts=True)
  _assert_same_samples(ref, out, prompts)
  assert len(set(np.asarray(ref.mask.sum(1)).tolist())) > 3


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
  mesh = sharding.make_mesh(dict(fsdp=2), devices=jax.devices()[:2])
  sharded = model.Transformer(m.cfg, rngs=nnx.Rngs(0),
                              ctx=sharding.ShardingCtx(mesh))
  with pytest.raises(ValueError, match='sharded over a mesh'):
    rollout.generate_continuous(sharded, prompts, cfg=sc, stop_ids=STOP,
                                slots=2)
  assert jnp.ndim(rollout.row_keys(jax.random.split(jax.random.key(0), 3),
                                   2)) == 1
