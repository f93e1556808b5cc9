"""The sampler: log-probs match a full forward pass, stopping, truncation, routing, one compile per shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cascade_jax import model
from cascade_jax import rollout

from _jit import call

STOP = 3


@pytest.fixture(scope='module')
def policy():
  cfg = model.tiny(vocab_size=48, pattern='*E*E')
  return model.Transformer(cfg, rngs=nnx.Rngs(0))


def _prompts(lengths, seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(4, 48, n).tolist() for n in lengths]


def _forward_logprobs(m, prompts, out, cfg):
  """Log-probs of the sampled tokens from one full forward pass per row."""
  rows = []
  width = max(map(len, prompts)) + out.tokens.shape[1]
  for i, p in enumerate(prompts):
    n = int(out.mask[i].sum())
    seq = p + out.tokens[i, :n].tolist()
    # Right padding to one width (one compile): causal, so it changes nothing.
    logits, _ = call(m, jnp.asarray([seq + [0] * (width - len(seq))]))
    step = logits[0, len(p) - 1:len(p) - 1 + n]
    if cfg.temperature == 0.0:
      rows.append(np.zeros(n))
      continue
    logp = jax.nn.log_softmax(rollout.process_logits(step, cfg), -1)
    rows.append(np.asarray(jnp.take_along_axis(
        logp, out.tokens[i, :n, None], -1)[:, 0]))
  return rows


@pytest.mark.parametrize('sample', [
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=1.3, top_k=5),
])
def test_sampler_logprobs_equal_a_full_forward_pass(policy, sample):
  cfg = rollout.SampleConfig(max_new_tokens=10, prompt_bucket=8, **sample)
  prompts = _prompts([3, 7, 12, 1]) * 2          # two samples per prompt
  out = rollout.generate(policy, prompts, cfg=cfg, stop_ids=STOP,
                         key=jax.random.key(1))
  for i, ref in enumerate(_forward_logprobs(policy, prompts, out, cfg)):
    n = len(ref)
    np.testing.assert_allclose(out.logprobs[i, :n], ref, atol=1e-5)
    assert float(jnp.abs(out.logprobs[i, n:]).sum()) == 0.0


def test_stop_tokens_masks_and_truncation(policy):
  cfg = rollout.SampleConfig(max_new_tokens=6, temperature=1.0, prompt_bucket=4)
  prompts = _prompts([2, 5, 9, 4, 6, 3, 8, 1])
  # Stop on the most likely first token of some rows, so both cases occur.
  out = rollout.generate(policy, prompts, cfg=cfg, stop_ids=STOP, pad_id=0,
                         key=jax.random.key(0))
  toks, mask = np.asarray(out.tokens), np.asarray(out.mask)
  for row, m, cut in zip(toks, mask, np.asarray(out.truncated)):
    n = int(m.sum())
    assert m[:n].all() and not m[n:].any()   # one contiguous response
    stops = np.flatnonzero(row == STOP)
    if cut:
      assert n == cfg.max_new_tokens and stops.size == 0
    else:
      assert stops[0] == n - 1                 # the stop token is included
      assert (row[n:] == 0).all()              # padded after it


def test_greedy_picks_the_argmax_and_ignores_the_key(policy):
  cfg = rollout.SampleConfig(max_new_tokens=5, temperature=0.0)
  prompts = _prompts([4, 9])
  a = rollout.generate(policy, prompts, cfg=cfg, stop_ids=-1,
                       key=jax.random.key(0))
  b = rollout.generate(policy, prompts, cfg=cfg, stop_ids=-1,
                       key=jax.random.key(7))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  width = max(map(len, prompts)) + a.tokens.shape[1]
  for i, p in enumerate(prompts):
    seq = p + a.tokens[i].tolist()
    # Right padding to one width (one compile): causal, so it changes nothing.
    logits, _ = call(policy, jnp.asarray([seq + [0] * (width - len(seq))]))
    np.testing.assert_array_equal(
        jnp.argmax(logits[0, len(p) - 1:len(seq) - 1], -1), a.tokens[i])


def _first_stop(row, stops):
  hits = [j for j, t in enumerate(row) if t in stops]
  return hits[0] + 1 if hits else len(row)


def test_several_stop_ids_end_a_reply_at_the_first_of_any(policy):
  # Qwen3 ends a turn at <|im_end|> or <|endoftext|>. Greedy, so a row's
  # tokens do not depend on where the others stop: pick two ids from the
  # unstopped replies, then each row must end at its first of either.
  cfg = rollout.SampleConfig(max_new_tokens=8, temperature=0.0)
  prompts = _prompts([4, 9, 6, 2], seed=3)
  free = np.asarray(rollout.generate(policy, prompts, cfg=cfg,
                                     stop_ids=()).tokens)
  stops = (int(free[0, 2]), int(free[1, 5]))
  out = rollout.generate(policy, prompts, cfg=cfg, stop_ids=stops)
  turn = rollout.Conversation(policy, prompts, cfg=cfg, max_slots=32,
                              stop_ids=stops, prompt_width=9).generate(
                                  np.ones(len(prompts), bool),
                                  jax.random.key(0))
  ends = [_first_stop(row, stops) for row in free]
  assert ends[0] <= 3 and ends[1] <= 6
  for got in (out, turn):
    mask = np.asarray(got.mask)
    np.testing.assert_array_equal(mask.sum(1), ends)
    for i, n in enumerate(ends):
      np.testing.assert_array_equal(np.asarray(got.tokens)[i, :n],
                                    free[i, :n])
  np.testing.assert_array_equal(
      np.asarray(out.truncated), [e == 8 and free[i, 7] not in stops
                                  for i, e in enumerate(ends)])
  np.testing.assert_array_equal(turn.stopped, ~np.asarray(out.truncated))
  # One stop id equals the old single-id call.
  one = rollout.generate(policy, prompts, cfg=cfg, stop_ids=stops[0])
  np.testing.assert_array_equal(np.asarray(one.mask).sum(1),
                                [_first_stop(r, stops[:1]) for r in free])


def test_recorded_experts_are_the_forward_pass_routing(policy):
  cfg = rollout.SampleConfig(max_new_tokens=5, temperature=1.0,
                             prompt_bucket=8)
  prompts = _prompts([8, 8])                     # no padding: same positions
  out = rollout.generate(policy, prompts, cfg=cfg, stop_ids=-1,
                         record_experts=True)
  seq = jnp.concatenate([jnp.asarray(prompts), out.tokens], 1)
  _, info = call(policy, seq)
  # Every position that consumed a token (the last sampled one never did).
  np.testing.assert_array_equal(out.expert_idx[:, :-1],
                                info['expert_idx'][:, :-1])


def test_compiles_once_per_shape_bucket(policy):
  cfg = rollout.SampleConfig(max_new_tokens=4, prompt_bucket=16)
  rollout.generate(policy, _prompts([3, 5]), cfg=cfg, stop_ids=STOP)
  before = rollout.trace_count()
  for seed, lengths in enumerate([[1, 16], [7, 2], [16, 9]]):
    rollout.generate(policy, _prompts(lengths, seed), cfg=cfg, stop_ids=STOP,
                     key=jax.random.key(seed))
  assert rollout.trace_count() == before       # same (2, 16) bucket
  rollout.generate(policy, _prompts([17, 2]), cfg=cfg, stop_ids=STOP)
  assert rollout.trace_count() == before + 1   # the next bucket compiles


def test_empty_prompt_is_refused(policy):
  with pytest.raises(ValueError, match='at least one token'):
    rollout.generate(policy, [[5], []], cfg=rollout.SampleConfig(),
                     stop_ids=STOP)


def test_token_choice_is_argmax_and_categorical_exactly():
  # The sampler's two-reduction argmax (first index of the maximum) and its
  # Gumbel-max draw are jnp.argmax and jax.random.categorical, ties included.
  from cascade_jax import ops  # pylint: disable=g-import-not-at-top
  from cascade_jax.rollout import _sampler  # pylint: disable=g-import-not-at-top
  logits = jax.random.normal(jax.random.key(0), (16, 50))
  logits = logits.at[:, 7].set(9.0).at[:, 30].set(9.0)  # a tie: 7 wins
  from cascade_jax import kernels  # pylint: disable=g-import-not-at-top
  impls = ['xla'] + (['cpu_kernel'] if kernels.argmax_available(jnp.float32)
                     else [])
  for impl in impls:
    with ops.forced(argmax=impl):
      np.testing.assert_array_equal(jax.jit(ops.argmax)(logits),
                                    jnp.argmax(logits, -1))
  cfg = rollout.SampleConfig(temperature=1.0)
  logits = jax.random.normal(jax.random.key(1), (16, 50))
  logp = jax.nn.log_softmax(logits)
  for seed in range(5):
    tok, lp, kept = _sampler.select_tokens(logits, jax.random.key(seed), cfg)
    np.testing.assert_array_equal(
        tok, jax.random.categorical(jax.random.key(seed), logp))
    np.testing.assert_allclose(lp, logp[jnp.arange(16), tok], rtol=1e-6)
    np.testing.assert_array_equal(kept, 50)       # no top-k / top-p: all
  # Top-k 5: five kept at every row, and the draw is among them.
  tok, _, kept = _sampler.select_tokens(logits, jax.random.key(0),
                                  rollout.SampleConfig(top_k=5))
  np.testing.assert_array_equal(kept, 5)
  assert all(int(t) in np.argsort(-np.asarray(row))[:5]
             for t, row in zip(tok, logits))


def test_a_reused_cache_leaves_no_trace(policy):
  # On the CPU the KV cache of one shape is kept and donated back to the
  # next call: a generation after another must equal one from a fresh cache.
  from cascade_jax.rollout import _sampler  # pylint: disable=g-import-not-at-top
  cfg = rollout.SampleConfig(max_new_tokens=6, temperature=1.0,
                             prompt_bucket=8)
  first, second = _prompts([8, 3, 5], seed=1), _prompts([2, 8, 6], seed=2)
  _sampler._CACHE_POOL.clear()
  fresh = rollout.generate(policy, second, cfg=cfg, stop_ids=STOP,
                           record_experts=True)
  rollout.generate(policy, first, cfg=cfg, stop_ids=STOP)
  if jax.default_backend() == 'cpu':
    assert len(_sampler._CACHE_POOL) == 1
  again = rollout.generate(policy, second, cfg=cfg, stop_ids=STOP,
                           record_experts=True)
  for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('pattern', ['*E*E', '*-'])
def test_cached_forward_equals_the_full_forward(pattern):
  # The one forward over a KV cache (the sampler's: decode layouts, rotary
  # tables, the last position's logits): a left-padded prefill and then a
  # token at a time compute what the model computes over the whole sequence.
  cfg = model.small(pattern=pattern, mlp_dim=64)
  m = model.Transformer(cfg, rngs=nnx.Rngs(0))
  toks = jax.random.randint(jax.random.key(0), (3, 8), 1, cfg.vocab_size)
  seg = jnp.array([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8, [0, 1, 1, 1, 1, 1, 1, 1]])
  pos = jnp.maximum(jnp.cumsum(seg, 1) - 1, 0)
  ref, info = call(m, toks, positions_bt=pos, segment_ids_bt=seg,
                   moe_dispatch='dense')  # small() drops at capacity
  layouts = rollout.model_decode_weights(m, 3)
  cache = model.init_cache(cfg, 3, 10)
  last, cache, experts = jax.jit(
      lambda t, c: rollout.forward(m, t, positions_bt=pos[:, :6],
                                   segment_ids_bt=seg[:, :6], cache=c,
                                   layouts=layouts, last_logits_only=True))(
                                       toks[:, :6], cache)
  np.testing.assert_allclose(last, ref[:, 5:6], atol=1e-5)
  if 'E' in pattern:   # batch-major routing, as the model reports it
    real = np.asarray(seg[:, :6]) != 0      # padding routes arbitrarily
    np.testing.assert_array_equal(np.asarray(experts)[real],
                                  np.asarray(info['expert_idx'])[:, :6][real])
  step = jax.jit(lambda t, p, s, c: rollout.forward(
      m, t, positions_bt=p, segment_ids_bt=s, cache=c, layouts=layouts))
  for t in (6, 7):     # then one token a step
    got, cache, _ = step(toks[:, t:t + 1], pos[:, t:t + 1], seg[:, t:t + 1],
                         cache)
    np.testing.assert_allclose(got, ref[:, t:t + 1], atol=1e-5)
  assert int(cache.index) == 8

def test_a_long_cache_is_read_in_written_blocks_with_the_same_samples():
  # A 2k-slot generation: with ops 'xla_written' the decode steps read only
  # the cache blocks written so far; the samples and their log-probs are
  # those of reading the whole cache every step.
  from cascade_jax import ops  # pylint: disable=g-import-not-at-top
  m = model.Transformer(model.tiny(vocab_size=48, pattern='*E'),
                        rngs=nnx.Rngs(2))
  cfg = rollout.SampleConfig(max_new_tokens=1100, temperature=1.0,
                             prompt_bucket=8)
  prompts = _prompts([1000, 977])
  assert ops.cache_slots(1000 + 1100) == 2100     # rounded only if forced
  with ops.forced(cache_attention='xla_written'):
    assert ops.cache_slots(1000 + 1100) == 2560
  out = {}
  for impl in ('xla_written', 'xla'):
    jax.clear_caches()     # a compiled sampler keeps the ops it was traced with
    ops.reset_selected()
    with ops.forced(cache_attention=impl, argmax='xla', moe_decode='xla'):
      out[impl] = rollout.generate(m, prompts, cfg=cfg, stop_ids=(),
                                   key=jax.random.key(4))
    assert ops.selected()['cache_attention'] == [f'{impl} (cpu, float32)']
  a, b = out['xla_written'], out['xla']
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  # The default reads the whole cache (the written blocks ran slower on
  # the CPU: docs/results/perf/decode_cache_2026-12-03), or the CPU kernel.
  jax.clear_caches()
  ops.reset_selected()
  with ops.forced(argmax='xla', moe_decode='xla'):
    rollout.generate(m, prompts, cfg=cfg, stop_ids=(), key=jax.random.key(4))
  want = ('cpu_kernel' if ops.cpu_kernel_enabled('cache_attention') is True
          else 'xla')
  assert ops.selected()['cache_attention'] == [f'{want} (cpu, float32)']


@pytest.mark.parametrize('pattern', [  # the hybrid's: CI
    '*E*E', pytest.param('ME*E', marks=pytest.mark.slow)])
def test_a_fused_prefill_samples_what_the_cache_read_samples(pattern):
  # The sampler's prefill writes new prompts into an empty cache: with
  # prefill_attention 'fused' (GPU / TPU's default) the prompt attends over
  # itself through `ops.attention` instead of over every cache slot. Same
  # cache, same samples, log-probs within float rounding; on CPU the cache
  # read stays the default. Left-padded prompts of different lengths, and
  # a hybrid (Mamba) model.
  from cascade_jax import ops  # pylint: disable=g-import-not-at-top
  mamba = (model.MambaConfig(num_heads=4, head_dim=4, state_dim=8,
                             num_groups=2, chunk_size=8)
           if 'M' in pattern else None)
  m = model.Transformer(model.tiny(vocab_size=48, pattern=pattern,
                                   qk_norm=True, mamba=mamba),
                        rngs=nnx.Rngs(3))
  cfg = rollout.SampleConfig(max_new_tokens=12, temperature=1.0,
                             prompt_bucket=8)
  prompts = _prompts([13, 5, 9])
  out = {}
  for impl in ('fused', 'cache'):
    jax.clear_caches()
    ops.reset_selected()
    with ops.forced(prefill_attention=impl):
      out[impl] = rollout.generate(m, prompts, cfg=cfg, stop_ids=(),
                                   key=jax.random.key(7))
    assert ops.selected()['prefill_attention'] == [f'{impl} (cpu, float32)']
  np.testing.assert_array_equal(out['fused'].tokens, out['cache'].tokens)
  np.testing.assert_allclose(out['fused'].logprobs, out['cache'].logprobs,
                             atol=1e-5)
  jax.clear_caches()
  ops.reset_selected()
  rollout.generate(m, prompts, cfg=cfg, stop_ids=(), key=jax.random.key(7))
  assert ops.selected()['prefill_attention'] == ['cache (cpu, float32)']


@pytest.mark.parametrize('preset', [  # the hybrid: CI
    'small', pytest.param('small_hybrid', marks=pytest.mark.slow)])
def test_an_observation_fed_in_chunks_continues_as_one_block(preset):
  # Conversation.append feeds a later block bucket-wide columns at a time
  # (one program per batch, whatever the observation's width): the next
  # logits, the routing and the turn after it match the block fed whole.
  # The main job's models (capacity dispatch; the hybrid's Mamba layers
  # step over each chunk's columns), with the CPU kernels as `auto` picks.
  policy = model.Transformer(model.preset(preset, vocab_size=48),
                             rngs=nnx.Rngs(0))
  cfg = rollout.SampleConfig(max_new_tokens=6, temperature=0.0)
  prompts = _prompts([5, 9, 7])
  obs = {0: _prompts([40])[0], 2: _prompts([13], seed=1)[0]}   # row 1: none
  turns, logits, experts, index = [], [], [], []
  for bucket in (16, 48):                 # 3 chunks of 16; one block of 48
    conv = rollout.Conversation(policy, prompts, cfg=cfg, max_slots=80,
                                stop_ids=(), record_experts=True)
    conv.generate(np.ones(3, bool), jax.random.key(0))
    experts.append(conv.append(obs, bucket=bucket))
    logits.append(np.asarray(conv.logits))
    turns.append(conv.generate(np.ones(3, bool), jax.random.key(1)))
    index.append(conv.index)
  assert index[0] == index[1] and experts[0].shape[:2] == (3, 48)
  for row, toks in obs.items():     # a row's tokens: its last columns
    np.testing.assert_array_equal(experts[0][row, -len(toks):],
                                  experts[1][row, -len(toks):])
  np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)
  np.testing.assert_array_equal(turns[0].tokens, turns[1].tokens)
  np.testing.assert_allclose(turns[0].logprobs, turns[1].logprobs, atol=1e-5)
