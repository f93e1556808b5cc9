"""Streaming Hugging Face import: sharded safetensors onto a mesh, a run directory, bad input named.

The oracle is transformers (torch CPU) on tiny random checkpoints saved in
shards (`max_shard_size`), imported on 8 fake devices with the mesh a user
would pass (`--config.mesh.fsdp=8`), and restored the way every stage
restores a run (`train.restore_run`).
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from cascade_jax import checkpoint  # pylint: disable=g-import-not-at-top
from cascade_jax.data import load_hf_tokenizer  # pylint: disable=g-import-not-at-top
from cascade_jax import rollout  # pylint: disable=g-import-not-at-top
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top
from cascade_jax import train  # pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 64


def _qwen3(dtype=torch.float32):
  torch.manual_seed(0)
  cfg = transformers.Qwen3MoeConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
      moe_intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
      num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
      norm_topk_prob=True, max_position_embeddings=128, mlp_only_layers=[1],
      rope_theta=1000.0)
  m = transformers.Qwen3MoeForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith('norm.weight'):
        p.uniform_(0.5, 1.5)
  return m.to(dtype)


def _nemotron():
  import test_hf_nemotron_h  # pylint: disable=g-import-not-at-top
  return test_hf_nemotron_h._hf_model(  # pylint: disable=protected-access
      layers_block_type=['linear_attention', 'moe', 'full_attention',
                         'moe'] * 2, n_routed_experts=8)


def _save(m, path):
  m.save_pretrained(path, max_shard_size='40KB')   # several shards + index
  assert os.path.exists(os.path.join(path, 'model.safetensors.index.json'))
  return path


@pytest.fixture(scope='module')
def qwen3_dir(tmp_path_factory):
  m = _qwen3()
  return _save(m, str(tmp_path_factory.mktemp('qwen3'))), m


@pytest.fixture(scope='module')
def nemotron_dir(tmp_path_factory):
  m = _nemotron()
  return _save(m, str(tmp_path_factory.mktemp('nemotron'))), m


def _ctx(**axes):
  """The mesh and rules a stage gets from `--config.mesh.<axis>=N`."""
  c = ml_collections.ConfigDict(train.placement_defaults())
  c.mesh.update(dict(dict(data=1), **axes))
  return train.mesh_ctx(c)


def _tokens(t=21):   # rows: a multiple of the 8 devices the batch splits over
  return np.random.RandomState(0).randint(1, VOCAB, (8, t))


def _logits(model, tokens):
  graph, state = nnx.split(model)
  f = jax.jit(lambda s, x: nnx.merge(graph, s)(x)[0])
  return np.asarray(f(state, jnp.asarray(tokens)))


def _hf_logits(m, tokens):
  with torch.no_grad():
    return m(torch.tensor(tokens)).logits.float().numpy()


@pytest.mark.slow  # ~30 s for both: CI runs them; the one-device imports stay
@pytest.mark.parametrize('arch', ['qwen3', 'nemotron'])
def test_import_run_on_a_mesh_matches_transformers(arch, qwen3_dir,
                                                   nemotron_dir, tmp_path):
  path, hf_model = qwen3_dir if arch == 'qwen3' else nemotron_dir
  ctx = _ctx(fsdp=8)
  run = str(tmp_path / 'run')
  cfg, model = train.import_hf(path, run, ctx=ctx)
  assert cfg.param_dtype == 'float32' and cfg.moe.dispatch == 'dropless'
  # Every weight sits in its rules' sharding: no device holds a whole one.
  state = nnx.state(model)
  for v, want in zip(jax.tree.leaves(state),
                     jax.tree.leaves(sharding.state_shardings(ctx, state))):
    assert v.sharding.is_equivalent_to(want, v.ndim)
  for v in (model.embed_vd[...], model.layers[0].blocks[1].mixer.w_gate_edf[...]):
    assert v.addressable_shards[0].data.size * 8 == v.size
  # The run directory restores like any stage's, on the same mesh.
  cfg2, restored, tok = train.restore_run(run, ctx=ctx)
  assert tok is None and cfg2 == cfg
  want = _hf_logits(hf_model, _tokens())
  np.testing.assert_allclose(_logits(restored, _tokens()), want, atol=1e-4,
                             rtol=0)
  # Greedy generation on the mesh (the sampler's cache and decode path)
  # is transformers' greedy choice, by full forwards, token for token.
  prompts = _tokens(13)
  seq = torch.tensor(prompts)
  with torch.no_grad():
    for _ in range(10):
      nxt = hf_model(seq).logits[:, -1].argmax(-1, keepdim=True)
      seq = torch.cat([seq, nxt], 1)
  out = rollout.generate(
      restored, prompts.tolist(), cfg=rollout.SampleConfig(
          max_new_tokens=10, temperature=0.0, prompt_bucket=8), stop_ids=())
  np.testing.assert_array_equal(np.asarray(out.tokens), seq.numpy()[:, 13:])


def test_bf16_checkpoint_keeps_its_dtype(tmp_path):
  m = _qwen3(torch.bfloat16)
  path = _save(m, str(tmp_path / 'bf16'))
  cfg, model = checkpoint.load_hf(path, ctx=_ctx(data=2, expert=4))
  assert cfg.param_dtype == 'bfloat16'
  assert model.layers[0].blocks[1].mixer.w_gate_edf[...].dtype == jnp.bfloat16
  # Bit-equal to the file: the expert weights of layer 2, expert 5.
  files = checkpoint.SafetensorsFiles(path)
  w = files.read('model.layers.2.mlp.experts.5.up_proj.weight')
  assert w.dtype == ml_dtypes.bfloat16
  ours = np.asarray(model.layer(5).mixer.w_up_edf[5])
  np.testing.assert_array_equal(ours, w.T)
  # float32 on request.
  cfg32, m32 = checkpoint.load_hf(path, dtype='float32')
  assert cfg32.param_dtype == 'float32'
  np.testing.assert_array_equal(np.asarray(m32.layer(5).mixer.w_up_edf[5]),
                                w.T.astype(np.float32))


def _copy(path, dst):
  os.makedirs(dst)
  for n in os.listdir(path):
    os.symlink(os.path.join(path, n), os.path.join(dst, n))
  return dst


def test_bad_checkpoints_are_named_before_reading(qwen3_dir, tmp_path):
  path, _ = qwen3_dir
  index = json.load(open(os.path.join(path, 'model.safetensors.index.json')))
  shard = sorted(set(index['weight_map'].values()))[1]
  # A missing shard file.
  bad = _copy(path, str(tmp_path / 'missing'))
  os.remove(os.path.join(bad, shard))
  with pytest.raises(FileNotFoundError, match=f'names the weights file {shard}'):
    checkpoint.load_hf(bad)
  # The index places a tensor in a file that does not hold it.
  bad = _copy(path, str(tmp_path / 'index'))
  os.remove(os.path.join(bad, 'model.safetensors.index.json'))
  wrong = dict(index)
  wrong['weight_map'] = dict(index['weight_map'],
                             **{'model.layers.9.mlp.gate.weight': shard})
  json.dump(wrong, open(os.path.join(bad, 'model.safetensors.index.json'), 'w'))
  with pytest.raises(ValueError, match=r'model\.layers\.9\.mlp\.gate\.weight'):
    checkpoint.load_hf(bad)
  # A truncated file.
  bad = _copy(path, str(tmp_path / 'trunc'))
  os.remove(os.path.join(bad, shard))
  data = open(os.path.join(path, shard), 'rb').read()
  open(os.path.join(bad, shard), 'wb').write(data[:-100])
  with pytest.raises(ValueError, match=f'{shard}: tensor .* does not fit'):
    checkpoint.load_hf(bad)
  # An architecture this library does not build.
  bad = _copy(path, str(tmp_path / 'arch'))
  os.remove(os.path.join(bad, 'config.json'))
  cfg = json.load(open(os.path.join(path, 'config.json')))
  json.dump(dict(cfg, model_type='llama'),
            open(os.path.join(bad, 'config.json'), 'w'))
  with pytest.raises(ValueError, match="model_type 'llama' is not one"):
    checkpoint.load_hf(bad)


def test_import_hf_command_line(qwen3_dir, tmp_path):
  """What a user types: the launcher with its default config and a mesh."""
  path, hf_model = qwen3_dir
  run = str(tmp_path / 'cli_run')
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=8')
  out = subprocess.run(
      [sys.executable, '-m', 'experiments.import_hf', f'--hf_dir={path}',
       f'--workdir={run}', '--config.mesh.fsdp=8'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert '[import_hf] 8 layers' in out.stdout
  spec = json.load(open(os.path.join(run, 'model.json')))
  assert spec['preset'] == 'qwen3_30b_a3b'
  cfg, model, _ = train.restore_run(run)
  np.testing.assert_allclose(_logits(model, _tokens()),
                             _hf_logits(hf_model, _tokens()), atol=1e-4,
                             rtol=0)


@pytest.mark.parametrize('on_mesh', [False, True])
def test_export_of_an_import_is_the_checkpoint_bit_for_bit(on_mesh, tmp_path):
  """bf16 in, bf16 out, sharded files both ways; transformers reads it.
  Exported from host arrays (one device) and from a mesh's shards."""
  m = _qwen3(torch.bfloat16)
  src = _save(m, str(tmp_path / 'src'))
  run = str(tmp_path / 'run')
  train.import_hf(src, run, ctx=_ctx(data=2, expert=4))
  from experiments import export_hf  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / 'out')
  files = export_hf.export(run, out, max_shard_bytes=60_000,
                           ctx=_ctx(fsdp=2, expert=4) if on_mesh else None)
  assert len(files) > 1 and os.path.exists(
      os.path.join(out, 'model.safetensors.index.json'))
  a, b = checkpoint.SafetensorsFiles(src), checkpoint.SafetensorsFiles(out)
  assert sorted(a.keys()) == sorted(b.keys())
  for k in a.keys():
    assert a[k].dtype == b[k].dtype == 'BF16', k
    assert a.read(k).tobytes() == b.read(k).tobytes(), k
  # Both read from disk the same way (the in-memory model's rotary buffer
  # was cast to bf16 by `.to`; a loaded one computes it afresh).
  load = transformers.Qwen3MoeForCausalLM.from_pretrained
  np.testing.assert_array_equal(_hf_logits(load(out).eval(), _tokens()),
                                _hf_logits(load(src).eval(), _tokens()))


def _chat_checkpoint(src: str, positions: int) -> tuple[str, int]:
  """A tiny transformers-written Qwen3-MoE with a BPE tokenizer and chat
  template in `src`: (src, the tokenizer's vocabulary size)."""
  import _hf_fixtures  # pylint: disable=g-import-not-at-top
  n = load_hf_tokenizer(_hf_fixtures.write_tokenizer(src)).vocab_size
  torch.manual_seed(0)
  cfg = transformers.Qwen3MoeConfig(
      vocab_size=n + 20, hidden_size=32, intermediate_size=48,
      moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
      norm_topk_prob=True, max_position_embeddings=positions)
  transformers.Qwen3MoeForCausalLM(cfg).save_pretrained(src)
  return src, n


# CI; the default suite runs the import itself (test_import_hf_command_line).
@pytest.mark.slow
def test_sft_starts_from_a_transformers_checkpoint(tmp_path):
  """`hf:DIR` as the SFT stage's init_from: imported into the stage
  (weights, the BPE tokenizer, its chat template and stop ids), then
  trained on chat data encoded by that template; the stage restores like
  any run, with the tokenizer a later stage inherits."""
  from cascade_jax import sft  # pylint: disable=g-import-not-at-top
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  src, n = _chat_checkpoint(str(tmp_path / 'hf'), 1024)
  c = sft_config.get_config('quick')
  c.mesh = type(c.mesh)({})
  c.init_from = f'hf:{src}'
  c.steps, c.eval_n, c.log_every = 4, 0, 2
  # The test BPE has 35 merges: its records are 2-3x the sentencepiece length.
  c.data.seq_len, c.data.too_long = 1024, 'skip'
  run = tmp_path / 'sft'
  sft.run(c, str(run))
  assert (run / 'imported' / 'checkpoints').is_dir()
  assert (run / 'hf_tokenizer' / 'tokenizer.json').exists()
  assert json.load(open(run / 'model.json'))['preset'] == 'qwen3_30b_a3b'
  rows = [json.loads(l) for l in open(run / 'sft_metrics.jsonl')]
  assert rows[-1]['step'] == 4 and all(np.isfinite(r['loss']) for r in rows)
  cfg2, _, tok = train.restore_run(str(run))
  assert cfg2.vocab_size == n + 20 and tok.vocab_size == n
  assert tok.stop_ids[0] == tok.im_end


@pytest.mark.slow   # ~100 s: a quick cascade (SFT, IF-RL, every domain scored)
def test_quick_cascade_starts_from_a_transformers_checkpoint(tmp_path):
  """The cascade from `hf:DIR`: SFT imports it (weights, BPE tokenizer, chat
  template, stop ids), IF-RL starts from the SFT stage with its tokenizer,
  and every domain, multi-turn episodes included, is scored after each stage.
  The learner scores exactly what the sampler drew, through the template."""
  from cascade_jax import cascade  # pylint: disable=g-import-not-at-top
  from configs import cascade as cascade_config  # pylint: disable=g-import-not-at-top
  src, n = _chat_checkpoint(str(tmp_path / 'hf'), 4096)
  c = cascade_config.get_config('quick')
  c.mesh = type(c.mesh)({})
  c.order = 'sft,if_rl'
  c.stages.sft.init_from = f'hf:{src}'
  # The test BPE has 35 merges: texts are 2-3x their sentencepiece length,
  # and the template's turn markers around an observation alone outgrow
  # tool_use's 32-token observations.
  c.stages.sft.data.seq_len, c.stages.sft.data.too_long = 1024, 'skip'
  c.episodes.max_observation_tokens, c.episodes.max_tokens = 160, 1536
  work = tmp_path / 'run'
  records = cascade.run(c, str(work))
  assert [r['name'] for r in records] == ['sft', 'if_rl']
  assert records[1]['init_from'] == 'sft'
  for r in records:
    assert r['scores'] and all(s['n'] > 0 for s in r['scores'].values())
  multi = [d for d in records[0]['scores'] if d in ('tool_use', 'swe_agent')]
  assert multi, 'no multi-turn domain was scored'
  assert (work / 'if_rl' / 'hf_tokenizer' / 'tokenizer.json').exists()
  rows = [json.loads(l) for l in open(work / 'if_rl' / 'rl_metrics.jsonl')]
  assert rows and max(r['sampler_mismatch_max'] for r in rows) <= 1e-5
