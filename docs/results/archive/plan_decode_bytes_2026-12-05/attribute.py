"""Where the 30B decode step's HBM bytes go: per instruction of the compiled TPU program.

Compiles the plan's decode step (configs/plan.py:qwen3_30b_a3b, v5p-64: 32
chips, fsdp 4 x expert 8, the bf16 sampler copy in the inference layout
with the `decode` weight layout, 8 rows a chip over a 10,241-token cache,
strict ops) for the TPU topology on this CPU host, unrolled at L of its 48 layers (`*E` each),
and splits XLA's `bytes accessed` over the program's instructions (the
entry computation's, and those of the conditionals and calls it runs):
each one's operands and output as they are in HBM, VMEM ones left out (a
fusion's parameter that only a slice or a dynamic-update-slice reads is
counted at what it reads, as XLA's cost analysis does; so is an embedding
table a gather reads rows of; a conditional counts its costlier branch, a
loop its body once, as XLA's cost analysis does). The rows are
grouped by what the instruction is (fusion kind, custom call target,
collective) and by the JAX op it came from (its metadata's op_name,
shortened), and per layer: compile at two depths and the difference is one
layer's bytes; the rest is the step's fixed part (embedding, head,
sampling).

  LIBTPU_INIT_ARGS=--xla_tpu_msa_inefficient_use_to_copy_ratio=1000 \
      .venv-tpu/bin/python docs/results/archive/plan_decode_bytes_2026-12-05/attribute.py 1 2

(memory-space assignment's VMEM prefetching off, so that a weight is
counted once, by its consumer; see ../plan_decode_layouts_2026-12-04).
`factor=F` sets the MoE's `ragged_buffer_factor` (0: the worst case, no
overflow branch).
"""
import collections
import dataclasses
import re
import sys

sys.path.insert(0, '.')
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

from configs import plan as plan_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import aot  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import ops  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from cascade_jax.aot import _plan  # pylint: disable=g-import-not-at-top,wrong-import-position

_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'bf16': 2,
          'f16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8,
          'f64': 8, 'token': 0}
_SHAPE = re.compile(r'\b(pred|s8|u8|s16|u16|bf16|f16|s32|u32|f32|s64|u64|f64)'
                    r'\[([0-9,]*)\](\{[^}]*\})?')


def _size(text: str) -> int:
  """Bytes of every array shape written in `text` (a tuple: the sum)."""
  total = 0
  for dtype, dims, layout in _SHAPE.findall(text):
    if layout and 'S(1)' in layout:     # VMEM, not HBM
      continue
    n = 1
    for d in dims.split(','):
      if d:
        n *= int(d)
    total += n * _BYTES[dtype]
  return total


_INSTR = re.compile(r'^(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$')
_HEAD = re.compile(r'^(ENTRY )?%?([\w.\-]+) ')
_SKIP = ('parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast',
         'after-all', 'partition-id', 'replica-id', 'copy-done',
         'all-gather-done', 'all-reduce-done', 'collective-permute-done',
         'async-done', 'call-done', 'opt-barrier')


def _parse(text: str):
  """The module as {computation: [instruction]}, {name: shape text} and
  {computation: {parameter name: number}}; an instruction is (name, shape,
  opcode, operand names, attributes, is root)."""
  comps, shapes, params, comp = {}, {}, {}, None
  for line in text.splitlines():
    if not line.startswith(' ') and line.rstrip().endswith('{'):
      m = _HEAD.match(line)
      comp = ('ENTRY' if m.group(1) else m.group(2)) if m else None
      comps[comp], params[comp] = [], {}
      continue
    m = _INSTR.match(line.strip())
    if not (comp and m):
      continue
    name, shape, opcode, rest = m.groups()
    depth, i = 1, 0
    while i < len(rest) and depth:
      depth += {'(': 1, ')': -1}.get(rest[i], 0)
      i += 1
    if opcode == 'parameter':
      params[comp][name] = int(rest[:i - 1])
    shapes[name] = shape
    comps[comp].append((name, shape, opcode,
                        re.findall(r'%([\w.\-]+)', rest[:i - 1]), rest[i:],
                        line.strip().startswith('ROOT')))
  return comps, shapes, params


def _op_name(attrs: str) -> str:
  m = re.search(r'op_name="([^"]*)"', attrs)
  if not m:
    return '?'
  name = re.sub(r'jit\([^)]*\)/', '', m.group(1))
  name = re.sub(r'\b(jvp|transpose|while|body|cond|checkpoint|remat)'
                r'\([^)]*\)/', '', name)
  name = re.sub(r'layers_\d+|_\d+\b', '', name)
  return '/'.join(name.split('/')[-3:])


def _rows(comp, module, prefix='') -> list[tuple[str, str, int]]:
  """(what, from, bytes) of each instruction of `comp` that touches HBM."""
  comps, shapes, params = module
  rows = []
  for _, shape, opcode, operands, attrs, _ in comps[comp]:
    if opcode in _SKIP or 'PrepareAsync' in attrs:
      continue
    op_bytes = [_size(shapes.get(o, '')) for o in operands]
    out_bytes = _size(shape)
    kind = opcode
    called = re.search(r'(?:to_apply|calls)=%([\w.\-]+)', attrs)
    if opcode == 'conditional':   # the costlier branch, as XLA counts it
      branches = re.findall(r'%([\w.\-]+)', re.search(
          r'branch_computations=\{([^}]*)\}', attrs).group(1))
      rows += max((_rows(b, module, prefix + 'cond/') for b in branches),
                  key=lambda r: sum(b for *_, b in r))
      continue
    if opcode in ('call', 'call-start', 'async-start') and called:
      rows += _rows(called.group(1), module, prefix + opcode + '/')
      continue
    if opcode == 'fusion':
      kind = 'fusion:' + re.search(r'kind=(\w+)', attrs).group(1)
      body = comps.get(called.group(1), [])
      users = {}
      for _, bshape, bop, bops, _, broot in body:
        for j, o in enumerate(bops):
          users.setdefault(o, []).append((bop, j, bshape))
        if broot and bop == 'dynamic-update-slice':    # in place
          out_bytes = _size(shapes.get(bops[1], ''))
      # A parameter only sliced, gathered from or updated in place is read
      # in part: what the slices and gathers produce.
      for pname, num in params.get(called.group(1), {}).items():
        us = users.get(pname, [])
        if num < len(op_bytes) and us and all(
            u in ('slice', 'dynamic-slice') or (u == 'gather' and j == 0) or
            (u == 'dynamic-update-slice' and j == 0) for u, j, _ in us):
          op_bytes[num] = sum(_size(s) for u, _, s in us
                              if u != 'dynamic-update-slice')
    elif opcode == 'dynamic-update-slice':                   # in place
      op_bytes[0], out_bytes = 0, op_bytes[1]
    elif opcode == 'copy-start':     # a prefetch: its HBM source, read once
      out_bytes = 0
    elif opcode == 'custom-call':
      target = re.search(r'custom_call_target="([^"]*)"', attrs)
      kind = 'custom-call:' + (target.group(1) if target else '?')
    rows.append((kind, prefix + _op_name(attrs), out_bytes + sum(op_bytes)))
  return rows


def attribute(text: str) -> list[tuple[str, str, int]]:
  return _rows('ENTRY', _parse(text))


def compile_decode(layers: int, buffer_factor: float | None = None):
  c = plan_config.get_config('qwen3_30b_a3b')
  cfg = aot.model_config(c)
  cfg = cfg.replace(scan_layers=False, pattern=cfg.pattern[:2 * layers])
  if buffer_factor is not None:
    cfg = cfg.replace(moe=dataclasses.replace(
        cfg.moe, ragged_buffer_factor=buffer_factor))
  spec = dict(c.meshes['v5p-64'].to_dict())
  devs, platform = _plan.devices(32, spec.pop('topology'))
  ctx = sharding.ShardingCtx(sharding.make_mesh(spec, devs))
  shapes = dict(_plan.mesh_shapes(c.shapes.to_dict(), 32),
                sampler_dtype='bfloat16', sampler_layout='inference',
                sampler_weight_layout='decode')
  fn, args, kw, _ = _plan._abstract_step('decode', cfg, ctx, None, shapes)  # pylint: disable=protected-access
  with ops.strict_mode(True), jax.default_device(devs[0]):
    compiled = fn.lower(*args, **kw).compile()
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  arg_bytes = sum(_plan.per_device_bytes(a) for a in args)
  return platform, compiled.as_text(), ca['bytes accessed'], arg_bytes


def main(depths, buffer_factor=None):
  tables = {}
  if buffer_factor is not None:
    print(f'moe.ragged_buffer_factor={buffer_factor}')
  for layers in depths:
    platform, text, total, arg_bytes = compile_decode(layers, buffer_factor)
    rows = attribute(text)
    counted = sum(b for *_, b in rows)
    print(f'{platform}, decode, {layers} layer(s): XLA bytes accessed '
          f'{total / 1e9:.3f} GB; these rows {counted / 1e9:.3f} GB; '
          f'arguments {arg_bytes / 1e9:.3f} GB')
    by = collections.Counter()
    for kind, name, b in rows:
      by[(kind, name)] += b
    tables[layers] = by
    last = rows
  lo, hi = depths[0], depths[-1]
  keys = set(tables[lo]) | set(tables[hi])
  per_layer = {k: (tables[hi][k] - tables[lo][k]) / (hi - lo) for k in keys}
  fixed = {k: tables[lo][k] - lo * per_layer[k] for k in keys}
  print(f'\nper layer: {sum(per_layer.values()) / 1e6:.1f} MB; fixed part: '
        f'{sum(fixed.values()) / 1e6:.1f} MB\n')
  print(f'{"instruction":<34} {"from":<52} {"MB/layer":>9} {"fixed MB":>9}')
  for k in sorted(keys, key=lambda k: -(abs(per_layer[k]) * 48 +
                                        abs(fixed[k]))):
    if abs(per_layer[k]) < 0.05e6 and abs(fixed[k]) < 0.5e6:
      continue
    print(f'{k[0][:34]:<34} {k[1][:52]:<52} {per_layer[k] / 1e6:>9.2f} '
          f'{fixed[k] / 1e6:>9.2f}')
  print(f'\nthe {hi}-layer program, its 20 largest instructions:')
  for kind, name, b in sorted(last, key=lambda r: -r[2])[:20]:
    print(f'{kind[:34]:<34} {name[:52]:<52} {b / 1e6:>9.2f} MB')


if __name__ == '__main__':
  args = sys.argv[1:]
  factor = [float(a.split('=')[1]) for a in args if a.startswith('factor=')]
  main([int(a) for a in args if '=' not in a] or [1, 2],
       factor[0] if factor else None)
