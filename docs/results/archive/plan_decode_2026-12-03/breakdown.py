"""Where a 30B decode step's bytes go: one layer unit ('*E'), unrolled, v5p-64.

Compiles the plan's decode step (configs/plan.py:qwen3_30b_a3b, inference
layout, bf16 sampler) at one repeat of the layer unit for the TPU topology
and lists the entry computation's instructions by the bytes of their
operands + outputs (a naive per-instruction count, not XLA's cost model:
a copy-start to memory space S(1) is a prefetch into VMEM, not an HBM
write). Run with libtpu (.venv-tpu) from the repository root:

  .venv-tpu/bin/python docs/results/archive/plan_decode_2026-12-03/breakdown.py
"""
import re
import sys

sys.path.insert(0, '.')
from configs import plan as plan_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import aot  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax.aot import _plan  # pylint: disable=g-import-not-at-top,wrong-import-position

DT = dict(bf16=2, f32=4, s32=4, u32=4, pred=1, s8=1, u8=1, f16=2)


def size(shape: str) -> int:
  total = 0
  for dt, dims in re.findall(r'(\w+)\[([\d,]*)\]', shape):
    n = 1
    for d in dims.split(','):
      n *= int(d) if d else 1
    total += n * DT.get(dt, 0)
  return total


def main():
  c = plan_config.get_config('qwen3_30b_a3b')
  cfg = aot.model_config(c).replace(pattern='*E', scan_layers=False)
  spec = dict(c.meshes['v5p-64'].to_dict())
  devs, platform = _plan.devices(32, spec.pop('topology'))
  ctx = sharding.ShardingCtx(sharding.make_mesh(spec, devs))
  shapes = dict(_plan.mesh_shapes(c.shapes.to_dict(), 32),
                sampler_dtype='bfloat16', sampler_layout='inference')
  compiled, _, _ = _plan._compile('decode', cfg, ctx, None, shapes)  # pylint: disable=protected-access
  flops, nbytes = _plan._cost(compiled)  # pylint: disable=protected-access
  print(f'{platform}, decode, one layer unit unrolled: cost_analysis '
        f'{nbytes / 1e9:.3f} GB accessed, {flops / 1e9:.2f} GFLOP')
  text = compiled.as_text()
  entry = text[text.index('\nENTRY '):]
  entry = entry[:entry.index('\n}')]
  out_size = {}
  rows = []
  for line in entry.splitlines()[1:]:
    m = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*?)\)', line)
    if not m:
      continue
    name, shape, op, args = m.groups()
    out_size[name] = size(shape)
    if op in ('parameter', 'constant', 'get-tuple-element', 'tuple',
              'bitcast'):
      continue
    ins = sum(out_size.get(a.strip().lstrip('%'), 0) for a in args.split(',')
              if a.strip().startswith('%'))
    where = re.search(r'op_name="([^"]*)"', line)
    vmem = 'S(1)' in shape
    rows.append((out_size[name] + ins, op + (' (to VMEM)' if vmem else ''),
                 name, ins, out_size[name], where.group(1)[:70] if where else ''))
  rows.sort(reverse=True)
  print(f'entry instructions, operands + outputs: '
        f'{sum(r[0] for r in rows) / 1e6:.1f} MB in all')
  print(f'{"MB":>8}  {"op":<28} {"in MB":>7} {"out MB":>7}  name / op_name')
  for total, op, name, ins, out, where in rows[:24]:
    print(f'{total / 1e6:8.1f}  {op:<28} {ins / 1e6:7.1f} {out / 1e6:7.1f}  '
          f'{name} {where}')


if __name__ == '__main__':
  main()
