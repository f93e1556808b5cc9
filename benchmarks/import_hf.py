"""Streaming Hugging Face import: peak host memory and throughput on a synthetic Qwen3-MoE checkpoint.

  python -m benchmarks.import_hf --dir=/tmp/bench_import       # ~2.6 GB bf16

Writes (once) a synthetic Qwen3-MoE checkpoint in bf16, one safetensors
file a layer with an index and no tokenizer, then imports it with
`experiments.import_hf` as a user would, (a) one process with 8 fake CPU
devices and `--config.mesh.fsdp=8`, (b) two processes x 4 devices
(jax.distributed on 127.0.0.1). Each process reports its own peak RSS
(`ru_maxrss`); the table compares it with the issue's bounds (1.25 x the
checkpoint's bytes + 1 GiB for one process, 0.6 x + 1 GiB each for two).
On CPU the devices' memory is the host's, so one process holding all 8
devices holds the whole model: the bound allows it once, plus a quarter.
"""

import json
import os
import socket
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
from absl import app
from absl import flags
from safetensors.numpy import save_file

from cascade_jax import utils

_DIR = flags.DEFINE_string('dir', '/tmp/bench_import', 'Where the synthetic '
                           'checkpoint and the runs go.')
_LAYERS = flags.DEFINE_integer('layers', 12, 'Decoder layers (~210 MB each).')
_WORKER = flags.DEFINE_string('worker', '', 'Internal: run one import '
                              '(JSON args) and print its peak RSS.')

GIB = 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hf_config(layers: int) -> dict:
  return dict(
      architectures=['Qwen3MoeForCausalLM'], model_type='qwen3_moe',
      vocab_size=32_000, hidden_size=1024, intermediate_size=2048,
      moe_intermediate_size=512, num_hidden_layers=layers,
      num_attention_heads=16, num_key_value_heads=4, head_dim=64,
      num_experts=64, num_experts_per_tok=8, norm_topk_prob=True,
      decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
      rope_theta=1e6, tie_word_embeddings=False, torch_dtype='bfloat16',
      max_position_embeddings=4096)


def write_checkpoint(path: str, layers: int) -> int:
  """The synthetic checkpoint (if absent); returns its bytes."""
  done = os.path.join(path, 'model.safetensors.index.json')
  if os.path.exists(done):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith('.safetensors'))
  os.makedirs(path, exist_ok=True)
  c = hf_config(layers)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(c, f, indent=2)
  rng = np.random.default_rng(0)
  d, v, e, f_ = c['hidden_size'], c['vocab_size'], c['num_experts'], c[
      'moe_intermediate_size']
  q, kv = c['num_attention_heads'] * c['head_dim'], c['num_key_value_heads'] * c[
      'head_dim']
  w = lambda *s: (rng.standard_normal(s, np.float32) * 0.02).astype(
      ml_dtypes.bfloat16)
  weight_map, total = {}, 0

  def save(name, tensors):
    nonlocal total
    save_file(tensors, os.path.join(path, name), metadata={'format': 'pt'})
    weight_map.update({k: name for k in tensors})
    total += os.path.getsize(os.path.join(path, name))

  save('model-embed.safetensors', {'model.embed_tokens.weight': w(v, d),
                                   'lm_head.weight': w(v, d),
                                   'model.norm.weight': w(d)})
  for i in range(layers):
    p = f'model.layers.{i}.'
    t = {p + 'input_layernorm.weight': w(d),
         p + 'post_attention_layernorm.weight': w(d),
         p + 'self_attn.q_proj.weight': w(q, d),
         p + 'self_attn.k_proj.weight': w(kv, d),
         p + 'self_attn.v_proj.weight': w(kv, d),
         p + 'self_attn.o_proj.weight': w(d, q),
         p + 'self_attn.q_norm.weight': w(c['head_dim']),
         p + 'self_attn.k_norm.weight': w(c['head_dim']),
         p + 'mlp.gate.weight': w(e, d)}
    for j in range(e):
      t[f'{p}mlp.experts.{j}.gate_proj.weight'] = w(f_, d)
      t[f'{p}mlp.experts.{j}.up_proj.weight'] = w(f_, d)
      t[f'{p}mlp.experts.{j}.down_proj.weight'] = w(d, f_)
    save(f'model-layer-{i:03d}.safetensors', t)
  with open(done, 'w') as f:
    json.dump(dict(metadata=dict(total_size=total), weight_map=weight_map), f)
  return total


def worker(args: dict) -> None:
  """One process of an import (run as its own interpreter)."""
  import resource  # pylint: disable=g-import-not-at-top
  cmd = [sys.executable, '-m', 'experiments.import_hf',
         f'--hf_dir={args["hf_dir"]}', f'--workdir={args["run"]}',
         '--config.mesh.data=1', f'--config.mesh.fsdp={args["fsdp"]}']
  if args['nproc'] > 1:
    cmd += ['--distributed=on', f'--coordinator_address={args["coord"]}',
            f'--num_processes={args["nproc"]}', f'--process_id={args["pid"]}']
  start = time.time()
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS='cpu',
                                XLA_FLAGS='--xla_force_host_platform_'
                                f'device_count={args["devices"]}'))
  rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
  print(json.dumps(dict(rc=out.returncode, rss=rss, seconds=time.time() - start,
                        tail=(out.stdout + out.stderr)[-2000:])), flush=True)


def same_tensors(a: str, b: str) -> bool:
  """Every tensor of checkpoint `a` in `b` with the same dtype, shape and
  bytes, and nothing else in `b`."""
  from cascade_jax import checkpoint  # pylint: disable=g-import-not-at-top
  fa, fb = checkpoint.SafetensorsFiles(a), checkpoint.SafetensorsFiles(b)
  if set(fa.keys()) != set(fb.keys()):
    return False
  for k in fa.keys():
    if fa[k].dtype != fb[k].dtype or fa[k].shape != fb[k].shape:
      return False
    if fa.read(k).tobytes() != fb.read(k).tobytes():
      return False
  return True


def _port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def run_import(hf_dir: str, run: str, nproc: int) -> list[dict]:
  coord = f'127.0.0.1:{_port()}'
  procs = []
  for pid in range(nproc):
    args = dict(hf_dir=hf_dir, run=run, nproc=nproc, pid=pid, coord=coord,
                devices=8 // nproc, fsdp=8)
    procs.append(subprocess.Popen(
        [sys.executable, '-m', 'benchmarks.import_hf',
         f'--worker={json.dumps(args)}'], cwd=ROOT, stdout=subprocess.PIPE,
        text=True))
  out = []
  for p in procs:
    stdout, _ = p.communicate()
    out.append(json.loads(stdout.strip().splitlines()[-1]))
  for r in out:
    if r['rc']:
      raise RuntimeError('import failed:\n' + r['tail'])
  return out


def main(argv):
  del argv
  if _WORKER.value:
    worker(json.loads(_WORKER.value))
    return
  hf_dir = os.path.join(_DIR.value, 'hf')
  size = write_checkpoint(hf_dir, _LAYERS.value)
  print(f'checkpoint: {size / 1e9:.2f} GB bf16, {_LAYERS.value} layers, one '
        'file a layer, no tokenizer', flush=True)
  rows = []
  for nproc, factor in ((1, 1.25), (2, 0.6)):
    run = os.path.join(_DIR.value, f'run_{nproc}p')
    subprocess.run(['rm', '-rf', run], check=True)
    res = run_import(hf_dir, run, nproc)
    bound = factor * size + GIB
    for pid, r in enumerate(res):
      rows.append(dict(processes=nproc, process=pid, devices=8 // nproc,
                       peak_rss_gb=r['rss'] / 1e9, bound_gb=bound / 1e9,
                       within=r['rss'] <= bound, seconds=r['seconds'],
                       gb_per_s=size / 1e9 / r['seconds']))
  # The round trip: the 1-process run exported (bf16) and compared with
  # the checkpoint it came from, tensor by tensor, bit for bit.
  out = os.path.join(_DIR.value, 'export')
  subprocess.run(['rm', '-rf', out], check=True)
  start = time.time()
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.export_hf',
       f'--run={os.path.join(_DIR.value, "run_1p")}', f'--out={out}',
       '--max_shard_gb=1'], cwd=ROOT, capture_output=True, text=True,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  if res.returncode:
    raise RuntimeError('export failed:\n' + res.stderr[-3000:])
  export_s = time.time() - start
  equal = same_tensors(hf_dir, out)
  print(f'export: {export_s:.1f}s, bit-equal to the original: {equal}')
  print('| processes | process | devices | peak RSS GB | bound GB | within | '
        'seconds | GB/s |')
  print('|---:|---:|---:|---:|---:|---|---:|---:|')
  for r in rows:
    print(f"| {r['processes']} | {r['process']} | {r['devices']} | "
          f"{r['peak_rss_gb']:.2f} | {r['bound_gb']:.2f} | "
          f"{'yes' if r['within'] else 'NO'} | {r['seconds']:.1f} | "
          f"{r['gb_per_s']:.3f} |")
  with open(os.path.join(_DIR.value, 'results.json'), 'w') as f:
    json.dump(dict(checkpoint_bytes=size, rows=rows, export_seconds=export_s,
                   round_trip_bit_equal=equal, **utils.provenance()), f,
              indent=2)


if __name__ == '__main__':
  app.run(main)
