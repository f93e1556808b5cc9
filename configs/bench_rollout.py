"""Rollout speed: our jitted KV-cache sampler against transformers' generate, same model and weights.

  python -m experiments.bench_rollout --config=configs/bench_rollout.py

A Qwen3-MoE-shaped model (exportable to transformers): embed 256, 4 layers,
8 experts top-2, 32 prompt tokens, 64 new tokens, greedy, in fp32 on CPU.
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
  c.repeats = 3
  c.torch_threads = 0           # 0: torch's default
  if arg == 'quick':
    c.embed_dim, c.layers, c.expert_dim, c.vocab_size = 32, 2, 32, 64
    c.prompt_len, c.new_tokens, c.batch_sizes, c.repeats = 8, 8, (2,), 1
  elif arg:
    raise ValueError(f'configs/bench_rollout.py: unknown argument {arg!r}')
  return c


def sweep():
  for dispatch in ('dense', 'capacity', 'ragged'):
    yield {'config.dispatch': dispatch}
