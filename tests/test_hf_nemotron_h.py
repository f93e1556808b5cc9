"""Hugging Face Nemotron-H (Mamba-2 + attention + MoE) import / export against transformers (torch CPU).

transformers runs its reference (pure torch) Mamba-2 path on the CPU, so a
tiny random `NemotronHForCausalLM` is the oracle: no download.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from cascade_jax import checkpoint  # pylint: disable=g-import-not-at-top
from cascade_jax import rollout  # pylint: disable=g-import-not-at-top

VOCAB = 64


def _hf_model(**kw):
  torch.manual_seed(0)
  base = dict(
      vocab_size=VOCAB, hidden_size=32,
      layers_block_type=['linear_attention', 'moe', 'full_attention', 'mlp',
                         'linear_attention', 'moe'],
      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
      intermediate_size=48, mamba_num_heads=4, mamba_head_dim=8,
      ssm_state_size=8, n_groups=2, conv_kernel=4, chunk_size=8,
      n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
      moe_shared_expert_intermediate_size=24, routed_scaling_factor=2.5,
      initializer_range=0.2, eos_token_id=VOCAB + 1, pad_token_id=0)
  cfg = transformers.NemotronHConfig(**{**base, **kw})
  m = transformers.NemotronHForCausalLM(cfg).eval()
  with torch.no_grad():  # random norms, biases and D, so that a wrong mapping shows
    for name, p in m.named_parameters():
      if name.endswith(('norm.weight', 'norm_f.weight')):
        p.uniform_(0.5, 1.5)
      elif name.endswith(('mixer.D', 'conv1d.bias')):
        p.uniform_(-1.0, 1.0)
      elif name.endswith('A_log'):
        p.uniform_(-1.0, 1.0)
    for mod in m.modules():
      if hasattr(mod, 'e_score_correction_bias'):
        mod.e_score_correction_bias.uniform_(-0.1, 0.1)
  return m


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  m = _hf_model()
  path = str(tmp_path_factory.mktemp('nemotron_h'))
  m.save_pretrained(path)
  return path, m


def _tokens(t=21):   # > 2 chunks of 8, not a multiple of 8
  return np.random.RandomState(0).randint(1, VOCAB, (2, t))


def _hf_logits(m, tokens):
  with torch.no_grad():
    return m(torch.tensor(tokens)).logits.float().numpy()


def _ours(path, **kw):
  cfg, model = checkpoint.load_hf_nemotron_h(path, **kw)
  return cfg, model


def _logits(model, tokens, **kw):
  """Our model's logits, jitted (eager op-by-op is slow for the SSD)."""
  nnx = __import__('flax').nnx
  graph, state = nnx.split(model)
  f = jax.jit(lambda s, x: nnx.merge(graph, s)(x, **kw)[0])
  return np.asarray(f(state, jnp.asarray(tokens)))


@pytest.mark.parametrize('dispatch', ['ragged', 'capacity'])
def test_import_matches_transformers_logits(hf_dir, dispatch):
  path, m = hf_dir
  cfg, model = _ours(path, dispatch=dispatch)
  assert cfg.pattern == 'ME*-ME'
  tokens = _tokens()
  ours = _logits(model, tokens, **(
      {'moe_dispatch': 'dropless'} if dispatch == 'capacity' else {}))
  np.testing.assert_allclose(ours, _hf_logits(m, tokens),
                             atol=1e-4, rtol=0)


@pytest.mark.slow   # the greedy generation against transformers decodes too
def test_prefill_then_decode_equals_full_forward(hf_dir):
  from cascade_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  path, _ = hf_dir
  cfg, model = _ours(path)
  from flax import nnx  # pylint: disable=g-import-not-at-top
  graph, state = nnx.split(model)

  def cached(s, x, start, c):   # the one forward over a KV cache
    m = nnx.merge(graph, s)
    b, t = x.shape
    pos = jnp.broadcast_to(start + jnp.arange(t), (b, t))
    return rollout.forward(m, x, positions_bt=pos,
                           segment_ids_bt=jnp.ones((b, t), jnp.int32), cache=c,
                           layouts=rollout.model_decode_weights(m, b))
  fwd = jax.jit(cached, static_argnums=2)
  tokens = jnp.asarray(_tokens(27))
  full = _logits(model, tokens)
  cache = model_lib.init_cache(cfg, 2, 32)
  logits, cache, _ = fwd(state, tokens[:, :19], 0, cache)   # chunked prefill
  steps = [logits]
  for t in range(19, 27):
    lg, cache, _ = fwd(state, tokens[:, t:t + 1], t, cache)
    steps.append(lg)
  np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, 1)),
                             full, atol=1e-5, rtol=0)


def test_greedy_generation_matches_transformers(hf_dir):
  path, m = hf_dir
  cfg, model = _ours(path)
  prompt = _tokens(19)[:1]
  with torch.no_grad():
    want = m.generate(torch.tensor(prompt), max_new_tokens=12,
                      do_sample=False, eos_token_id=None,
                      pad_token_id=0).numpy()[0, prompt.shape[1]:]
  out = rollout.generate(
      model, [list(prompt[0])],
      cfg=rollout.SampleConfig(max_new_tokens=12, temperature=0.0,
                               prompt_bucket=8),
      stop_ids=VOCAB + 1 if VOCAB + 1 < cfg.vocab_size else -1)
  np.testing.assert_array_equal(np.asarray(out.tokens[0]), want)


def test_export_round_trips_through_transformers(hf_dir, tmp_path):
  path, m = hf_dir
  cfg, model = _ours(path)
  out = str(tmp_path / 'export')
  checkpoint.save_hf_nemotron_h(cfg, model, out)
  back = transformers.NemotronHForCausalLM.from_pretrained(out).eval()
  tokens = _tokens()
  np.testing.assert_allclose(_hf_logits(back, tokens), _hf_logits(m, tokens),
                             atol=1e-5, rtol=0)
  cfg2, model2 = _ours(out)
  assert cfg2 == cfg
  a = jax.tree.leaves(jax.tree.map(np.asarray, __import__('flax').nnx.state(model)))
  b = jax.tree.leaves(jax.tree.map(np.asarray, __import__('flax').nnx.state(model2)))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


def test_legacy_pattern_and_other_shapes(tmp_path):
  """hybrid_override_pattern, 1 group, conv 3, chunk 5, scale 1.0, no conv bias."""
  m = _hf_model(layers_block_type=None, hybrid_override_pattern='M*EM-E',
                n_groups=1, conv_kernel=3, chunk_size=5, mamba_num_heads=6,
                mamba_head_dim=4, routed_scaling_factor=1.0,
                use_conv_bias=False, num_experts_per_tok=3)
  path = str(tmp_path / 'legacy')
  m.save_pretrained(path)
  cfg_json = json.load(open(os.path.join(path, 'config.json')))
  cfg_json.pop('layers_block_type', None)
  cfg_json['hybrid_override_pattern'] = 'M*EM-E'
  json.dump(cfg_json, open(os.path.join(path, 'config.json'), 'w'))
  cfg, model = _ours(path)
  assert cfg.pattern == 'M*EM-E' and cfg.mamba.num_groups == 1
  tokens = _tokens(17)
  np.testing.assert_allclose(_logits(model, tokens), _hf_logits(m, tokens),
                             atol=1e-4, rtol=0)


def test_missing_mamba_tensor_is_named(hf_dir, tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  path, _ = hf_dir
  bad = tmp_path / 'bad'
  bad.mkdir()
  tensors = load_file(os.path.join(path, 'model.safetensors'))
  del tensors['backbone.layers.4.mixer.A_log']
  save_file(tensors, str(bad / 'model.safetensors'))
  (bad / 'config.json').write_text(open(os.path.join(path, 'config.json')).read())
  with pytest.raises(ValueError, match=r'lacks 1 weights.*layers\.4\.mixer\.A_log'):
    checkpoint.load_hf_nemotron_h(str(bad))


def test_wrong_shape_and_unknown_kind_are_named(hf_dir, tmp_path):
  path, _ = hf_dir
  cfg = json.load(open(os.path.join(path, 'config.json')))
  bad = tmp_path / 'shape'
  bad.mkdir()
  os.symlink(os.path.join(path, 'model.safetensors'), bad / 'model.safetensors')
  (bad / 'config.json').write_text(json.dumps({**cfg, 'ssm_state_size': 16}))
  with pytest.raises(ValueError, match=r'in_proj\.weight has shape'):
    checkpoint.load_hf_nemotron_h(str(bad))
  (bad / 'config.json').write_text(json.dumps(
      {**cfg, 'layers_block_type': ['linear_attention', 'sliding_attention']}))
  with pytest.raises(ValueError, match='unknown kinds'):
    checkpoint.load_hf_nemotron_h(str(bad))
  (bad / 'config.json').write_text(json.dumps({**cfg, 'mamba_num_heads': 3}))
  with pytest.raises(ValueError, match='mamba.num_groups'):
    checkpoint.load_hf_nemotron_h(str(bad))


def test_dt_is_clamped_by_time_step_limit_not_time_step_min(hf_dir):
  # NVIDIA's checkpoints (and transformers >= 5.25) clamp dt by
  # time_step_limit, (0, inf); time_step_min only bounds dt_bias's init.
  path, _ = hf_dir
  hf = json.load(open(os.path.join(path, 'config.json')))
  assert hf['time_step_min'] == 0.001
  assert checkpoint.config_from_hf_nemotron_h(hf).mamba.dt_min == 0.0
  hf['time_step_limit'] = [0.01, {'__float__': 'Infinity'}]
  assert checkpoint.config_from_hf_nemotron_h(hf).mamba.dt_min == 0.01
  hf['time_step_limit'] = [0.0, 0.5]
  with pytest.raises(ValueError, match='time_step_limit'):
    checkpoint.config_from_hf_nemotron_h(hf)


def _mixer_reference(mixer, x, dt_floor):
  """A Mamba-2 mixer from its definition, in float64 numpy, token by token:
  in_proj -> (z, xBC, dt); causal depthwise conv + SiLU on xBC; dt =
  softplus(dt + dt_bias) floored at `dt_floor`; h_t = exp(dt A) h_{t-1} +
  dt x_t B_t^T, y_t = h_t C_t + D x_t per head (its group's B, C); the
  gated group RMSNorm of y by SiLU(z); out_proj."""
  p = {k: v.detach().double().numpy() for k, v in mixer.named_parameters()}
  heads, hd, groups = mixer.num_heads, mixer.head_dim, mixer.n_groups
  inner, n, k = mixer.intermediate_size, mixer.ssm_state_size, mixer.conv_kernel_size
  z, xbc, dt = np.split(x @ p['in_proj.weight'].T, [inner, 2 * inner
                                                    + 2 * groups * n], -1)
  w = p['conv1d.weight'][:, 0, :]                   # [channels, kernel]
  padded = np.pad(xbc, ((0, 0), (k - 1, 0), (0, 0)))
  conv = sum(padded[:, j:j + xbc.shape[1]] * w[:, j] for j in range(k))
  conv = conv + p['conv1d.bias']
  conv = conv / (1 + np.exp(-conv))                 # SiLU
  xs, bm, cm = np.split(conv, [inner, inner + groups * n], -1)
  b_, t_ = x.shape[:2]
  xs = xs.reshape(b_, t_, heads, hd)
  bm, cm = bm.reshape(b_, t_, groups, n), cm.reshape(b_, t_, groups, n)
  dt = np.maximum(np.log1p(np.exp(dt + p['dt_bias'])), dt_floor)
  a = -np.exp(p['A_log'])
  g = np.arange(heads) // (heads // groups)         # each head's group
  h = np.zeros((b_, heads, hd, n))
  ys = []
  for t in range(t_):
    decay = np.exp(dt[:, t] * a)[:, :, None, None]
    h = decay * h + (dt[:, t, :, None, None] * xs[:, t, :, :, None]
                     * bm[:, t, g, None, :])
    ys.append(np.einsum('bhpn,bhn->bhp', h, cm[:, t, g])
              + p['D'][:, None] * xs[:, t])
  y = np.stack(ys, 1).reshape(b_, t_, inner) * (z / (1 + np.exp(-z)))
  y = y.reshape(b_, t_, groups, inner // groups)
  y = y / np.sqrt((y ** 2).mean(-1, keepdims=True) + mixer.norm.variance_epsilon)
  return (y.reshape(b_, t_, inner) * p['norm.weight']) @ p['out_proj.weight'].T


def test_transformers_mamba2_mixer_is_the_recurrence_clamped_by_time_step_limit():
  # The oracle's own Mamba-2 mixer (transformers >= 5.25) against the
  # definition computed in float64. dt_bias is pushed low so that many dt
  # fall under time_step_min (0.001): a floor there (transformers <= 5.24)
  # changes the output far beyond float32 noise; time_step_limit's (0, inf)
  # does not clamp.
  m = _hf_model()
  mixer = next(mod for mod in m.modules()
               if type(mod).__name__ == 'NemotronHMamba2Mixer')
  with torch.no_grad():
    mixer.dt_bias.copy_(torch.linspace(-9.0, 0.5, mixer.num_heads))
  x = np.random.RandomState(1).randn(2, 21, m.config.hidden_size)
  with torch.no_grad():
    got = mixer(torch.tensor(x, dtype=torch.float32)).double().numpy()
  assert tuple(m.config.time_step_limit) == (0.0, float('inf'))
  want = _mixer_reference(mixer, x, dt_floor=0.0)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
  floored = _mixer_reference(mixer, x, dt_floor=m.config.time_step_min)
  assert np.abs(floored - want).max() > 50 * 2e-5
