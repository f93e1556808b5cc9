"""MoE layer benchmark: every dispatch path against the ideal dense MLP.

Launch (about 1 minute on 2 CPU cores):

  python -m benchmarks.moe --config=benchmarks/configs/moe.py
  python -m benchmarks.moe --config=benchmarks/configs/moe.py:quick
  python -m benchmarks.moe --config=benchmarks/configs/moe.py \
      --config.num_experts=16 --config.dtype=bfloat16

The layer is the one from DEVELOPERS.md / CPU_SCALE.md: 8192 tokens, embed
512, expert width 1024, 8 experts, top-2, forward + backward.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.tokens = 8192
  c.embed_dim = 512
  c.expert_dim = 1024
  c.num_experts = 8
  c.top_k = 2
  c.activation = 'swiglu'        # 'swiglu' | 'relu2'
  c.capacity_factor = 1.25
  c.dtype = 'float32'
  c.paths = ('capacity', 'ragged', 'dense')
  c.repeats = 5
  c.matmul_size = 4096
  if arg == 'quick':              # seconds, for tests
    c.tokens, c.embed_dim, c.expert_dim = 256, 32, 64
    c.repeats, c.matmul_size = 2, 256
  elif arg:
    raise ValueError(f'benchmarks/configs/moe.py: unknown argument {arg!r} '
                     "(known: 'quick')")
  return c


def sweep():
  """Expert count and capacity factor, one run each."""
  for e in (8, 16):
    for cf in (1.0, 1.25):
      yield {'config.num_experts': e, 'config.capacity_factor': cf}
