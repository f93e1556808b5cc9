"""Rollout speed: our jitted KV-cache sampler against transformers' generate, same model and weights.

  python -m benchmarks.rollout --config=benchmarks/configs/rollout.py

A Qwen3-MoE-shaped model (exportable to transformers): embed 256, 4 layers,
8 experts top-2, 32 prompt tokens, 64 new tokens, greedy, in fp32 on CPU;
then one MoE layer's decode step, the CPU kernel against XLA's layouts.
About 2 minutes on 2 cores. The sampler runs the CPU kernels only where their
calibration found them faster on this machine (`cascade_jax.ops`);
`CASCADE_JAX_CPU_KERNELS=1` forces them, `=0` keeps to XLA's ops. `dispatch` does not change the sampler (its decode path
replaces the configured one); the sweep varies the expert count, i.e. how
sparse a token's share of the expert weights is.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.embed_dim = 256
  c.layers = 4
  c.num_experts = 8
  c.top_k = 2
  c.expert_dim = 256
  c.vocab_size = 1024
  c.prompt_len = 32
  c.new_tokens = 64
  c.batch_sizes = (1, 4, 16, 64)
  c.dispatch = 'dense'          # exact (dropless) for decoding small batches
  c.repeats = 5                 # interleaved, medians
  c.torch_threads = 0           # 0: torch's default
  if arg == 'quick':
    c.embed_dim, c.layers, c.expert_dim, c.vocab_size = 32, 2, 32, 64
    c.prompt_len, c.new_tokens, c.batch_sizes, c.repeats = 8, 8, (2,), 1
  elif arg:
    raise ValueError(f'benchmarks/configs/rollout.py: unknown argument {arg!r}')
  return c


def sweep():
  for num_experts in (8, 16, 32):
    yield {'config.num_experts': num_experts}
