"""The accelerator benchmark: MoE layer, train-step MFU, decode bandwidth.

  bash scripts/gpu_bench.sh                 # on an H200: the full sizes, < 8 min
  python -m benchmarks.accel --config=benchmarks/configs/accel.py:quick   # CPU, seconds

Full sizes:
- MoE layer fwd+bwd, bf16, Qwen3-like: 16384 tokens, embed 2048, 128
  experts x 768, top-8; each path against an ideal dense MLP of width
  top_k x 768 on the same tokens (target: dropless <= 1.3x).
- Train step of a ~1.3B-total MoE (`model`) at sequence 4096: MFU =
  model FLOPs / (time x peak bf16), peak_tflops the H200's dense bf16
  (989 TFLOP/s, NVIDIA's datasheet).
- Decoding with the sampler at batch 64 and 256: tokens/s, and the
  fraction of HBM bandwidth (hbm_tb_s) a step's reads (weights + KV cache)
  reach.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.dtype = 'bfloat16'
  c.peak_tflops = 989.0           # H200 SXM dense bf16
  c.hbm_tb_s = 4.8                # H200 HBM3e
  c.repeats = 5
  # Which parts run, comma-separated (a short lease reruns one).
  c.parts = 'moe,train,decode,mismatch'
  c.moe = ml_collections.ConfigDict(dict(
      tokens=16384, embed_dim=2048, expert_dim=768, num_experts=128, top_k=8,
      activation='swiglu', capacity_factor=1.25,
      paths=('ragged', 'dropless', 'capacity')))
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=32768, embed_dim=1024, layers=12, num_heads=16,
      num_kv_heads=4, head_dim=64, num_experts=64, top_k=8, expert_dim=512,
      dispatch='ragged'))
  c.train = ml_collections.ConfigDict(dict(batch=8, seq_len=4096))
  c.decode = ml_collections.ConfigDict(dict(
      batch_sizes=(64, 256), prompt_len=128, new_tokens=(64, 192)))
  if arg == 'quick':  # the same code at CPU sizes, for the test suite
    c.dtype, c.repeats = 'float32', 1
    c.moe.update(tokens=256, embed_dim=32, expert_dim=16, num_experts=8,
                 top_k=2)
    c.model.update(vocab_size=128, embed_dim=32, layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=8, num_experts=4, top_k=2,
                   expert_dim=16)
    c.train.update(batch=2, seq_len=64)
    c.decode.update(batch_sizes=(2,), prompt_len=8, new_tokens=(4, 24))
  elif arg:
    raise ValueError(f'benchmarks/configs/accel.py: unknown argument {arg!r} '
                     "(known: 'quick')")
  return c
