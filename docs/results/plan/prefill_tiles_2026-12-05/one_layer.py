"""A 30B sampler step at one layer unit ('*E', unrolled), v5p-64: XLA's count of its bytes and FLOPs.

Qwen3-30B-A3B (configs/plan.py:qwen3_30b_a3b), 32 chips (fsdp 4 x expert 8),
the bf16 sampler copy in the inference layout, compiled for the TPU
topology on this CPU host with libtpu, and the shapes of every grouped
matmul tokamax was handed (its "Autotuning cache miss" log lines). Run
with .venv-tpu from the repository root:

  .venv-tpu/bin/python docs/results/plan/prefill_tiles_2026-12-05/one_layer.py prefill
"""
import sys

sys.path.insert(0, '.')
from configs import plan as plan_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import aot  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax.aot import _plan  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(step: str):
  c = plan_config.get_config('qwen3_30b_a3b')
  cfg = aot.model_config(c).replace(pattern='*E', scan_layers=False)
  spec = dict(c.meshes['v5p-64'].to_dict())
  devs, platform = _plan.devices(32, spec.pop('topology'))
  ctx = sharding.ShardingCtx(sharding.make_mesh(spec, devs))
  shapes = dict(_plan.mesh_shapes(c.shapes.to_dict(), 32),
                sampler_dtype='bfloat16', sampler_layout='inference',
                sampler_weight_layout='auto')
  compiled, _, _ = _plan._compile(step, cfg, ctx, None, shapes)  # pylint: disable=protected-access
  flops, nbytes = _plan._cost(compiled)  # pylint: disable=protected-access
  print(f'{platform}, {step}, one layer unit unrolled: {nbytes / 1e9:.3f} GB '
        f'accessed, {flops / 1e12:.3f} TFLOP; ops: {_plan.picked_ops()}')


if __name__ == '__main__':
  main(sys.argv[1])
