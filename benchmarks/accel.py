"""The accelerator benchmark: MoE layer vs ideal, train-step MFU, decode bandwidth; one table.

  bash scripts/gpu_bench.sh     # H200: benchmarks/configs/accel.py full sizes
  python -m benchmarks.accel --config=benchmarks/configs/accel.py:quick

Prints which implementation each op ran (`cascade_jax.ops`), then a table:
metric, value, target. With --workdir: config.json and results.json.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app
from absl import flags
from flax import nnx
from ml_collections import config_flags

from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import rl
from cascade_jax import rollout
from cascade_jax import utils
from benchmarks import moe_layers

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'benchmarks/configs/accel.py', 'Benchmark config.', lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'If set, writes config.json and results.json here.')


def _model_cfg(c) -> model_lib.ModelConfig:
  m = c.model
  return model_lib.ModelConfig(
      vocab_size=m.vocab_size, embed_dim=m.embed_dim, pattern='*E' * m.layers,
      num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
      qk_norm=True, rope_theta=1e6, dtype=c.dtype, param_dtype='float32',
      moe=model_lib.MoEConfig(num_experts=m.num_experts, top_k=m.top_k,
                              expert_dim=m.expert_dim, dispatch=m.dispatch))


def train_flops_per_token(cfg: model_lib.ModelConfig, seq_len: int) -> float:
  """6 x active matmul parameters (no input embedding) + causal attention's 6 L T N H."""
  counts = model_lib.count_params(cfg)
  matmul = counts.active - counts.embedding
  if cfg.tie_embeddings:
    matmul += counts.embedding  # the head is the table
  attn = 6 * cfg.pattern.count('*') * seq_len * cfg.num_heads * cfg.head_dim
  return 6 * matmul + attn


def moe_rows(c) -> list[list]:
  rows = moe_layers.moe_layer_benchmark(
      dtype=c.dtype, repeats=c.repeats, matmul_size=4096 if c.dtype ==
      'bfloat16' else 512, **c.moe.to_dict())
  out = []
  for r in rows[1:-1]:
    target = '<= 1.3' if r['path'] in ('ragged', 'dropless') else ''
    out.append([f"MoE layer fwd+bwd, {r['path']} / ideal dense", r['ratio'],
                target, f"{r['seconds'] * 1e3:.2f} ms, dropped "
                f"{r['dropped']:.3f}"])
  out.append(['ideal dense MLP fwd+bwd (ms)', rows[0]['seconds'] * 1e3, '',
              f"{rows[0]['gflops'] / 1e3:.0f} TFLOP/s useful"])
  return out


def train_rows(c) -> list[list]:
  cfg = _model_cfg(c)
  m = model_lib.Transformer(cfg, rngs=nnx.Rngs(0))
  graph, params, rest = nnx.split(m, nnx.Param, ...)
  opt = optax.adamw(1e-4)
  opt_state = opt.init(params)
  b, t = c.train.batch, c.train.seq_len
  toks = jax.random.randint(jax.random.key(0), (b, t + 1), 0, cfg.vocab_size)

  @jax.jit
  def step(params, opt_state, toks):
    def loss(params):
      logits, info = nnx.merge(graph, params, rest)(toks[:, :-1])
      lp = ops.token_logprobs(logits, toks[:, 1:])
      return -jnp.mean(lp) + info['aux_loss']
    val, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, val

  params, opt_state, val = step(params, opt_state, toks)  # compile
  jax.block_until_ready(val)
  times = []
  for _ in range(c.repeats):
    t0 = time.perf_counter()
    params, opt_state, val = step(params, opt_state, toks)
    jax.block_until_ready(val)
    times.append(time.perf_counter() - t0)
  sec = float(np.median(times))
  flops = train_flops_per_token(cfg, t) * b * t
  mfu = flops / sec / (c.peak_tflops * 1e12)
  counts = model_lib.count_params(cfg)
  return [[f'train step MFU, seq {t} x {b} ({counts})', mfu, '>= 0.40',
           f'{sec * 1e3:.1f} ms/step, {b * t / sec:,.0f} tok/s, loss '
           f'{float(val):.3f}']]


def _learner_and_sync(cfg: model_lib.ModelConfig, dtype: str):
  """The learner's fp32 master weights (graph, params, rest), the sampler's
  graph in `dtype` and the weight sync to it (`rl.sync_fn`)."""
  graph, params, rest = nnx.split(model_lib.Transformer(cfg, rngs=nnx.Rngs(0)),
                                  nnx.Param, ...)
  sgraph, sparams, srest = rl.sampler_state(cfg, dtype, None)
  sync = rl.sync_fn(jax.tree.map(
      lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype), (sparams, srest)))
  return graph, params, rest, sgraph, sync


def mismatch_rows(c) -> list[list]:
  """The learner (fp32 master weights, its kernels: cuDNN attention over the
  sequence, the grouped matmul) scoring tokens the sampler drew from its
  `c.dtype` copy (its kernels: attention over the cache), routing replayed,
  temperature 1: the gap `rl.correction` corrects, as the RL step logs it
  (`rl.check_on_policy`)."""
  cfg = _model_cfg(c)
  graph, params, rest, sgraph, sync = _learner_and_sync(cfg, c.dtype)
  copy = sync((params, rest))
  sampler = nnx.merge(sgraph, *copy)
  bsz, p, n = (c.decode.batch_sizes[0], c.decode.prompt_len,
               c.decode.new_tokens[1])
  rng = np.random.RandomState(1)
  prompt_bp, lens = rollout.pad_prompts(
      rng.randint(1, cfg.vocab_size, (bsz, p)).tolist(), p, 0)
  rc = rl.RLConfig(max_new_tokens=n, temperature=1.0)
  ro = rollout.generate_padded(sampler, prompt_bp, lens, cfg=rc.sample_config,
                               stop_ids=-1, key=jax.random.key(0),
                               record_experts=True)
  batch = rl.from_rollout(prompt_bp, lens, ro, np.zeros(bsz, np.float32))
  out = {}
  narrow = f'{c.dtype} sampler'
  for name, g, pr, rs in ((narrow, graph, params, rest),
                          ('same weights', sgraph, *copy)):
    m = rl.check_on_policy(pr, rs, batch, graph=g, cfg=rc,
                           moe=rl.exact_moe(cfg, batch))
    out[name] = {k: float(v) for k, v in m.items()}
  tokens = int(np.asarray(batch.mask).sum())
  return [[f'learner vs sampler |d logp|, {what}: mean', out[what][
      'sampler_mismatch_mean'], '', f"max {out[what]['sampler_mismatch_max']:.3g}"
           f', {tokens:,} tokens, batch {bsz}, dropped '
           f"{out[what]['dropped_learner']:.3g}"]
          for what in (narrow, 'same weights')]


def decode_rows(c) -> list[list]:
  """The sampler as RL runs it at scale (`rl.sampler_dtype='bfloat16'`):
  the fp32 master weights narrowed by the weight sync (timed), then decoding
  from that copy."""
  cfg = _model_cfg(c)
  _, params, rest, sgraph, sync = _learner_and_sync(cfg, c.dtype)
  copy = jax.block_until_ready(sync((params, rest)))  # compile
  ts = []
  for _ in range(c.repeats):
    t0 = time.perf_counter()
    copy = jax.block_until_ready(sync((params, rest)))
    ts.append(time.perf_counter() - t0)
  sync_s = float(np.median(ts))
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  moved = nbytes((params, rest)) + nbytes(copy)
  m = nnx.merge(sgraph, *copy)
  w_bytes = nbytes(copy[0])
  rows = [[f'weight sync fp32 -> {c.dtype} (ms)', sync_s * 1e3, '',
           f'{moved / sync_s / 1e9:,.0f} GB/s read + written, '
           f'{moved / 1e9:.2f} GB']]
  n_attn = cfg.pattern.count('*')
  rng = np.random.RandomState(0)
  short, long = c.decode.new_tokens
  for bsz in c.decode.batch_sizes:
    prompts = rng.randint(1, cfg.vocab_size, (bsz, c.decode.prompt_len))
    secs = {}
    for n in (short, long):
      sc = rollout.SampleConfig(max_new_tokens=n, temperature=0.0,
                                prompt_bucket=c.decode.prompt_len)
      run = lambda sc=sc: np.asarray(rollout.generate(
          m, prompts.tolist(), cfg=sc, stop_ids=-1).tokens)
      run()  # compile
      ts = []
      for _ in range(c.repeats):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
      secs[n] = float(np.median(ts))
    step_s = (secs[long] - secs[short]) / (long - short)
    how = 'ms/step'
    if step_s <= 0:  # timing noise over a tiny difference (CPU test sizes)
      step_s, how = secs[long] / long, 'ms/token of the whole generation'
    mean_len = c.decode.prompt_len + (short + long) / 2
    kv_bytes = (2 * n_attn * bsz * mean_len * cfg.num_kv_heads *
                cfg.head_dim * jnp.dtype(cfg.dtype).itemsize)
    frac = (w_bytes + kv_bytes) / step_s / (c.hbm_tb_s * 1e12)
    rows.append([f'decode batch {bsz}: tokens/s', bsz / step_s, '',
                 f'{step_s * 1e3:.2f} {how}'])
    rows.append([f'decode batch {bsz}: HBM bandwidth fraction', frac, '',
                 f'{(w_bytes + kv_bytes) / 1e9:.2f} GB read/step'])
  return rows


def main(argv):
  del argv
  c = _CONFIG.value
  dev = jax.devices()[0]
  print(f'device: {dev.device_kind} ({jax.default_backend()}), jax '
        f'{jax.__version__}, {c.dtype}; {time.strftime("%Y-%m-%d")}', flush=True)
  rows, failed = [], []
  header = ['metric', 'value', 'target', 'detail']

  def save():
    if _WORKDIR.value:
      utils.write_results(_WORKDIR.value, c, dict(
          device=dev.device_kind, backend=jax.default_backend(),
          jax=jax.__version__, ops=ops.selected(), failed=failed,
          rows=[dict(zip(header, r)) for r in rows]))

  # Each part's rows are printed and saved as it ends, and a part that
  # fails is recorded and the next one runs: one lease gives what it can.
  parts = dict(moe=('MoE layer', moe_rows), train=('train step', train_rows),
               decode=('decode', decode_rows),
               mismatch=('mismatch', mismatch_rows))
  wanted = [p.strip() for p in c.parts.split(',') if p.strip()]
  if unknown := set(wanted) - set(parts):
    raise ValueError(f'bench_accel: parts {sorted(unknown)} unknown (known: '
                     f'{list(parts)})')
  for name, fn in (parts[p] for p in wanted):
    t0 = time.perf_counter()
    try:
      part = fn(c)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(dict(part=name, error=f'{type(e).__name__}: {e}'))
      print(f'[bench_accel] {name} FAILED after '
            f'{time.perf_counter() - t0:.0f}s: {type(e).__name__}: '
            f'{str(e)[:2000]}', flush=True)
      save()
      continue
    rows += part
    print(f'[bench_accel] {name} done in {time.perf_counter() - t0:.0f}s',
          flush=True)
    print(utils.format_table(header, part), flush=True)
    save()
  print('\nops picked:')
  for op, picks in ops.selected().items():
    print(f'  {op}: {", ".join(picks)}')
  print()
  print(utils.format_table(header, rows))
  if failed:
    raise SystemExit(f'bench_accel: {len(failed)} part(s) failed: '
                     f'{[f["part"] for f in failed]}')


if __name__ == '__main__':
  app.run(main)
