"""A roofline model of one GRPO step on a pod, synchronous against decoupled, from the AOT plan's phase times.

  python -m experiments.decoupled_model \
      --learner=docs/results/archive/plan_slices_2026-12-02/results.json \
      --sampler=docs/results/archive/plan_rollout_rows_2026-12-06/plan/results.json \
      --variant='32 rows'

Not a measurement: each phase's time is the plan's v5p roofline for its
compiled step (max(FLOPs / peak, HBM bytes / bandwidth), communication not
counted), scaled to the recipe's batch:
- update: the GRPO step's counted time (one 10,239-position rollout a
  chip, `--mesh`), times the micro-batches the recipe's batch needs
  (`--prompts` x `--rollouts` rollouts over the chips);
- generation: the decode step's compiled time (its rows a chip: the
  sampler plan's `--variant`, by default 64 rows decoding with an index a
  row, as continuous batching does; '' for a plan without variants; a
  10,240-slot cache) times `--response` tokens, times the
  rounds of rows the batch needs (every row decoded to the budget: no long
  tail, no continuous batching), plus the learner plan's prefill time for
  every row (its rows a prefill step; a prefill is bound by its FLOPs);
- sync: the weight sync's compiled time; rewards: not modelled (host work,
  overlapped with the next round's decoding in both loops).

The synchronous step is generation + update + sync on all `chips`. A
decoupled step gives S chips to the sampler and L = chips - S to the
learner and overlaps them: max(generation x chips / S, update x chips / L)
+ sync, each phase's time scaled by the chips it loses (both are bound by
per-chip work: weights read per chip for decoding, FLOPs per chip for the
update). L must hold the learner: at least `--min_learner_chips` (the
plan's smallest slice where GRPO fits v5p's 95 GB: 8 chips).

Which splits the code runs on a pod (the `runs on a pod` column): on
several hosts the sampler is a process beside each learner process
(`rl.rollout_worker=process`), so each host's chips split between the two
the same way: L and S whole numbers of chips a host (`--chips_per_host`,
v5p's 4), with the sampler's mesh (`rl.rollout_mesh`) keeping each host's
blocks of the weights within what its learner chips hold (checked when
the weights arrive). The other splits are the model's, not the code's (a
sampler thread on devices of its own runs on one host only).
"""

import json

from absl import app
from absl import flags

_LEARNER = flags.DEFINE_string(
    'learner', 'docs/results/archive/plan_slices_2026-12-02/results.json',
    'Plan results with the grpo and prefill rows.')
_SAMPLER = flags.DEFINE_string(
    'sampler', 'docs/results/plan/row_index_2026-12-07/plan/results.json',
    'Plan results with the decode and sync rows (compiled at depth).')
_MESH = flags.DEFINE_string('mesh', 'v5p-64 (32)', 'The rows\' mesh.')
_PROMPTS = flags.DEFINE_integer('prompts', 128, 'Prompts a step (recipe).')
_ROLLOUTS = flags.DEFINE_integer('rollouts', 16, 'Rollouts a prompt (recipe).')
_RESPONSE = flags.DEFINE_integer('response', 8192, 'Decode steps a round.')
_PROMPT = flags.DEFINE_integer('prompt', 2048, 'Prompt tokens (tokens/s).')
_MIN_L = flags.DEFINE_integer('min_learner_chips', 8,
                              'Fewest chips the learner fits on.')
_PER_HOST = flags.DEFINE_integer('chips_per_host', 4,
                                 "Chips a host (v5p's 4).")
_VARIANT = flags.DEFINE_string(
    'variant', '64 rows, an index a row',
    "The sampler plan's variant for the decode and "
    "sync rows (e.g. '32 rows' with --sampler="
    'docs/results/archive/plan_rollout_rows_2026-12-06/plan/results.json, from '
    'configs/plan.py:qwen3_30b_a3b_rollout_rows).')
_OUT = flags.DEFINE_string('out', '', 'Writes model.json here if set.')


def _row(path, mesh, step, variant=''):
  with open(path) as f:
    rows = json.load(f)
  for r in rows:
    if (r['mesh'] == mesh and r['step'] == step and
        r.get('variant', '') == variant):
      return r
  raise ValueError(f'{path}: no {step} row on {mesh}'
                   + (f' at variant {variant!r}' if variant else ''))


def _ms(r):
  """The compiled roofline where the plan has it, else the counted one."""
  v = r.get('v5p ms')
  return v if v == v and v is not None else r['v5p ms (counted)']


def phases(mesh: str) -> dict:
  v = _VARIANT.value
  grpo = _row(_LEARNER.value, mesh, 'grpo')
  # The learner plan's prefill (its counted, FLOP-bound time: XLA's count
  # of the grouped matmuls' bytes prices their worst-case buffers), per row.
  prefill = _row(_LEARNER.value, mesh, 'prefill')
  decode = _row(_SAMPLER.value, mesh, 'decode', v)
  sync = _row(_SAMPLER.value, mesh, 'sync', v)
  chips = int(mesh.split('(')[1].rstrip(')'))
  rows = _PROMPTS.value * _ROLLOUTS.value
  # The update's compiled step: one rollout a chip.
  micro = -(-rows // chips)
  # The sampler's: decode['tokens'] rows over the mesh a round; the
  # prefill's tokens are its rows x the prompt.
  rounds = -(-rows // decode['tokens'])
  prefills = -(-rows // (prefill['tokens'] // _PROMPT.value))
  gen = (prefills * _ms(prefill) +
         rounds * _RESPONSE.value * _ms(decode)) / 1e3
  return dict(chips=chips, rows=rows, micro_batches=micro, rounds=rounds,
              prefills=prefills, decode_rows=decode['tokens'],
              update_s=micro * _ms(grpo) / 1e3, generation_s=gen,
              sync_s=_ms(sync) / 1e3, decode_ms=_ms(decode),
              prefill_ms=_ms(prefill), grpo_ms=_ms(grpo))


def model(p: dict) -> dict:
  sync_step = p['generation_s'] + p['update_s'] + p['sync_s']
  hosts = max(p['chips'] // _PER_HOST.value, 1)
  splits = []
  for learner in range(_MIN_L.value, p['chips']):
    sampler = p['chips'] - learner
    gen = p['generation_s'] * p['chips'] / sampler
    upd = p['update_s'] * p['chips'] / learner
    step = max(gen, upd) + p['sync_s']
    splits.append(dict(learner_chips=learner, sampler_chips=sampler,
                       generation_s=gen, update_s=upd, step_s=step,
                       speedup=sync_step / step,
                       runs_on_a_pod=learner % hosts == 0))
  best = max(splits, key=lambda s: s['speedup'])
  tokens = p['rows'] * (_PROMPT.value + _RESPONSE.value)
  per_chip = lambda t: tokens / t / p['chips']
  return dict(phases=p, sync_step_s=sync_step, splits=splits, best=best,
              tokens=tokens, sync_tokens_per_s_chip=per_chip(sync_step),
              best_tokens_per_s_chip=per_chip(best['step_s']))


def main(argv):
  del argv
  m = model(phases(_MESH.value))
  p = m['phases']
  print(f"{_MESH.value}: {p['rows']} rollouts a step ({_PROMPTS.value} x "
        f"{_ROLLOUTS.value}), {_RESPONSE.value}-token responses, v5p roofline")
  print(f"  generation {p['generation_s']:.1f} s ({p['prefills']} x "
        f"prefill {p['prefill_ms']:.0f} ms + {p['rounds']} rounds of "
        f"{p['decode_rows']} rows x {_RESPONSE.value} x "
        f"{p['decode_ms']:.1f} ms), update {p['update_s']:.1f} s "
        f"({p['micro_batches']} x {p['grpo_ms']:.0f} ms), sync "
        f"{p['sync_s'] * 1e3:.0f} ms")
  print(f"  synchronous step: {m['sync_step_s']:.1f} s "
        f"(generation {p['generation_s'] / m['sync_step_s']:.0%})")
  print('| learner chips | sampler chips | generation s | update s | step s '
        '| sync / decoupled | runs on a pod |')
  print('|---:|---:|---:|---:|---:|---:|---|')
  for s in m['splits']:
    if s['learner_chips'] in (8, 12, 16, 24) or s is m['best']:
      print(f"| {s['learner_chips']} | {s['sampler_chips']} | "
            f"{s['generation_s']:.1f} | {s['update_s']:.1f} | "
            f"{s['step_s']:.1f} | {s['speedup']:.2f} | "
            f"{'yes (sampler processes)' if s['runs_on_a_pod'] else 'model'}"
            ' |')
  b = m['best']
  print(f"  best split: learner {b['learner_chips']}, sampler "
        f"{b['sampler_chips']}: {b['speedup']:.2f} x the synchronous step")
  print(f"  tokens (prompt + response) per second a chip, roofline model: "
        f"synchronous {m['sync_tokens_per_s_chip']:.0f}, decoupled (best) "
        f"{m['best_tokens_per_s_chip']:.0f}; NeMo-RL's published figure "
        "for Qwen3-30B-A3B GRPO (H100, 4k): 1,102 tokens/s/GPU, measured")
  if _OUT.value:
    with open(_OUT.value, 'w') as f:
      json.dump(m, f, indent=2)


if __name__ == '__main__':
  app.run(main)
