"""The plan's report: one compiled step's cost per device, the accelerators' peaks, the table.

`StepCost` is what `aot.run` measures of a step on a mesh; `table` lays a
plan out for people, `from_results` reads one back from results.json.
"""

from __future__ import annotations

import dataclasses

# Published peaks: dense bf16 FLOP/s, HBM bandwidth (bytes/s), HBM (bytes).
ACCELERATORS = {
    'h200': dict(flops=989e12, hbm_bw=4.8e12, hbm=141e9),
    'v5p': dict(flops=459e12, hbm_bw=2.76e12, hbm=95e9),
}
GB = 1e9


@dataclasses.dataclass
class StepCost:
  """One compiled step on one mesh, per device."""
  step: str
  mesh: str
  devices: int
  platform: str               # what it was compiled for: 'tpu v5p', 'cpu'
  tokens: int                 # per step, all devices
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int            # outputs written into donated arguments
  flops: float
  bytes_accessed: float
  compile_s: float
  state_bytes: int            # counted from the shapes and shardings: weights
                              # (+ optimizer state when training), per device
  model_flops: float          # counted: matmul FLOPs of the active weights, per device
  # Why the figures are partial, e.g. the compiler ran out of device memory
  # (then temp_bytes is what it said the temporaries need, arguments are the
  # counted state plus the batch, and FLOPs are NaN).
  note: str = ''
  # Which of the config's `variants` (shape overrides) it was compiled at.
  variant: str = ''
  # The compiler's whole message when it refused the step (its list of the
  # largest buffers included); `note` is its first sentence, for tables.
  error: str = ''
  # The implementation each heavy op picked while the step was traced
  # (`ops.selected`), e.g. 'attention=splash, cache_attention=pallas'.
  ops: str = ''

  @property
  def peak_bytes(self) -> int:
    """Arguments + outputs + temporaries, donated outputs counted once."""
    return (self.argument_bytes + self.output_bytes + self.temp_bytes
            - self.alias_bytes)

  def seconds(self, accel: str, *, counted: bool = False) -> float:
    """Roofline time: FLOPs over peak or bytes over HBM bandwidth, whichever
    is larger; cost_analysis' figures, or `counted`: the counted matmul
    FLOPs and the arguments (weights, optimizer state, KV cache, batch)
    read once, a lower bound."""
    a = ACCELERATORS[accel]
    if counted:
      return max(self.model_flops / a['flops'],
                 self.argument_bytes / a['hbm_bw'])
    return max(self.flops / a['flops'], self.bytes_accessed / a['hbm_bw'])

  def free_bytes(self, accel: str) -> int:
    """The chip's HBM left beside the step's peak (negative: over by that
    much). The runtime's own reserve and fragmentation come out of it."""
    return int(ACCELERATORS[accel]['hbm']) - self.peak_bytes

  def fits(self, accel: str) -> bool:
    """Peak within the chip's HBM, and the step compiled (a step the
    compiler refused, `note`, does not run as configured)."""
    return not self.note and self.peak_bytes <= ACCELERATORS[accel]['hbm']


def from_results(rows: list[dict]) -> list[StepCost]:
  """StepCosts back from an `experiments.plan` results.json."""
  fields = [f.name for f in dataclasses.fields(StepCost)]
  out = []
  for r in rows:
    mesh, devices = r['mesh'].rsplit(' (', 1)
    out.append(StepCost(**{
        **{k: r[k] for k in fields if k in r}, 'mesh': mesh,
        'devices': int(devices.rstrip(')')), 'step': r['step'],
        'tokens': r['tokens'], 'variant': r.get('variant', ''),
        'error': r.get('error', ''), 'ops': r.get('ops', '')}))
  return out


def table(costs: list[StepCost]) -> tuple[list[str], list[list]]:
  """(header, rows) of the plan's report, one row per step and mesh."""
  header = ['mesh', 'step', 'tokens', 'args GB', 'state GB (counted)',
            'out GB', 'temp GB', 'peak GB', 'TFLOP', 'TFLOP (counted)',
            'HBM GB moved', 'v5p ms', 'v5p ms (counted)', 'H200 ms',
            'fits v5p', 'v5p free GB', 'fits H200', 'H200 free GB', 'note']
  rows = []
  for c in costs:
    rows.append([f'{c.mesh} ({c.devices})',
                 c.step + (f' {c.variant}' if c.variant else ''), c.tokens,
                 c.argument_bytes / GB, c.state_bytes / GB,
                 c.output_bytes / GB, c.temp_bytes / GB, c.peak_bytes / GB,
                 c.flops / 1e12, c.model_flops / 1e12, c.bytes_accessed / GB,
                 1e3 * c.seconds('v5p'), 1e3 * c.seconds('v5p', counted=True),
                 1e3 * c.seconds('h200'),
                 'yes' if c.fits('v5p') else 'NO', c.free_bytes('v5p') / GB,
                 'yes' if c.fits('h200') else 'NO', c.free_bytes('h200') / GB,
                 c.note])
  return header, rows
