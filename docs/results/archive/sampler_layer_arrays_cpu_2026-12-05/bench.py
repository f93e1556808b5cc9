"""The CPU sampler on stacked weights against one array per layer (model.LayerArrays).

bench_rollout's model (benchmarks/configs/rollout.py: embed 256, '*E' x 4 -- one
stacked group of 4 repeats --, 8 experts top-2, vocab 1024, fp32), its
prompts (32 random tokens) and 64 new tokens, greedy: `rollout.generate` on
the model as built (stacked [4, ...] weights) and on the same weights split
(`model.split_layers`), interleaved, each timed run after an untimed one,
medians of `--repeats`. Prints a table and writes results.json.

  python docs/results/archive/sampler_layer_arrays_cpu_2026-12-05/bench.py [repeats] > .../output.txt
"""
import json
import os
import sys
import time

sys.path.insert(0, '.')
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from flax import nnx  # pylint: disable=g-import-not-at-top,wrong-import-position

from cascade_jax import model as model_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import rollout  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import bench_rollout  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(repeats: int):
  c = bench_rollout.get_config()
  cfg = model_lib.ModelConfig(
      vocab_size=c.vocab_size, embed_dim=c.embed_dim, pattern='*E' * c.layers,
      num_heads=4, num_kv_heads=2, head_dim=c.embed_dim // 4, qk_norm=True,
      rope_theta=1e6, moe=model_lib.MoEConfig(
          num_experts=c.num_experts, top_k=c.top_k, expert_dim=c.expert_dim,
          dispatch=c.dispatch))
  stacked = model_lib.Transformer(cfg, rngs=nnx.Rngs(0))
  graph, state = nnx.split(stacked)
  split = nnx.merge(graph, model_lib.split_layers(state))
  assert model_lib.has_layer_arrays(nnx.state(split))
  sc = rollout.SampleConfig(max_new_tokens=c.new_tokens, temperature=0.0,
                            prompt_bucket=c.prompt_len)
  rng = np.random.RandomState(0)
  rows = []
  print(f'jax {jax.__version__}, {os.cpu_count()} CPUs; {cfg.layer_groups}, '
        f'{c.new_tokens} new tokens, greedy, medians of {repeats}')
  print('| batch | stacked ms | one array a layer ms | stacked / split | tokens equal |')
  print('|---:|---:|---:|---:|---|')
  for b in (1, 16, 64):
    prompts = rng.randint(1, c.vocab_size, (b, c.prompt_len)).tolist()
    runs = {name: (lambda m=m: np.asarray(rollout.generate(
        m, prompts, cfg=sc, stop_ids=-1).tokens))
            for name, m in (('stacked', stacked), ('split', split))}
    out = {k: run() for k, run in runs.items()}   # compiles
    times = {k: [] for k in runs}
    for _ in range(repeats):
      for k, run in runs.items():
        run()
        t0 = time.perf_counter()
        run()
        times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    same = bool(np.array_equal(out['stacked'], out['split']))
    rows.append(dict(batch=b, stacked_ms=med['stacked'], split_ms=med['split'],
                     ratio=med['stacked'] / med['split'], tokens_equal=same,
                     times=times))
    print(f"| {b} | {med['stacked']:.1f} | {med['split']:.1f} | "
          f"{med['stacked'] / med['split']:.3f} | {same} |", flush=True)
  with open(os.path.join(os.path.dirname(__file__), 'results.json'), 'w') as f:
    json.dump(rows, f, indent=1)


if __name__ == '__main__':
  main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
