"""The TPU compiler's memory-usage report of a step, its buffers summed by kind.

  python docs/results/archive/plan_nemotron_depth_2026-12-04/heap_by_kind.py REPORT

REPORT: a `*after_optimizations-memory-usage-report.txt` from a compile with
XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text". Buffers at different
offsets of the heap may be live at different times, so the sums are the
space each kind takes at some point, not at once; the heap's size is the
report's total.
"""

import collections
import re
import sys

_UNITS = {'GiB': 2**30, 'MiB': 2**20, 'KiB': 2**10, 'B': 1}
_KINDS = (
    (r'f32\[5,16,(2688,1856|1856,2688)\]',
     "the scanned group's expert weights, all 5 repeats, fp32 (expert 8)"),
    (r'bf16\[5,16,(2688,1856|1856,2688)\]',
     "the scanned group's expert weights, all 5 repeats, bf16 (expert 8)"),
    (r'bf16\[(1,)?128,(2688,1856|1856,2688)\]',
     'whole expert weights of a layer, bf16 (all 128 experts)'),
    (r'f32\[(\d+,)?128,(1856,336|336,1856)\]',
     'expert weight shards (an eighth), fp32'),
    (r'131072', 'embedding / output head'),
    (r'\[9830[45],|\[\d+,8,2,1408\]',
     "expert-parallel receive buffers (2 x the mean load: 98,304 rows)"),
    (r'\[49152,|\[8192,6,|\[49153,', 'MoE token rows (8,192 x top-6)'),
    (r'64,64,128|64,128,64,64|8192,64,64', 'Mamba chunk states'),
)


def main(path):
  total = collections.Counter()
  offsets = collections.defaultdict(set)
  with open(path) as f:
    lines = f.read().splitlines()
  print(next(l for l in lines if l.startswith('Total bytes')))
  for line in lines:
    parts = line.split(';')
    if len(parts) < 5:
      continue
    m = re.match(r'([\d.]+)(GiB|MiB|KiB|B)$', parts[1].strip())
    if not m:
      continue
    size = float(m.group(1)) * _UNITS[m.group(2)]
    kind = next((k for pat, k in _KINDS if re.search(pat, parts[4])), 'other')
    total[kind] += size
    offsets[kind].add(parts[2].strip())
  for kind, size in total.most_common():
    print(f'{size / 2**30:7.2f} GiB in {len(offsets[kind]):3d} heap slots  '
          f'{kind}')


if __name__ == '__main__':
  main(sys.argv[1])
