"""Converts a run's checkpoints written before the layers were stacked (one module per layer) to the stacked layout.

  python -m experiments.convert_checkpoint --run_dir=runs/cascade/sft
  python -m experiments.convert_checkpoint --run_dir=runs/cascade     # every stage

Every step of `<run>/checkpoints` is read, its weights, other variables and
optimizer moments restacked (`checkpoint.convert_state`), and written with
its side data to a new directory; then the old one is kept as
`checkpoints.per_layer` and the new one takes its place. A run already in
the stacked layout is left alone. The model comes from the run's
`model.json` (or its config), as when it is restored.
"""

import os
import shutil

from absl import app
from absl import flags
from absl import logging

from cascade_jax import checkpoint
from cascade_jax import train

_RUN_DIR = flags.DEFINE_string(
    'run_dir', None, 'A run directory (with checkpoints/), or a cascade '
    'directory whose stages are converted in turn.', required=True)


def _paths(tree, prefix=''):
  if isinstance(tree, dict):
    for k, v in tree.items():
      yield from _paths(v, f'{prefix}{k}/')
  else:
    yield prefix


def convert_run(run_dir: str) -> int:
  """Converts one run's checkpoints in place; returns the steps converted."""
  src = os.path.join(run_dir, 'checkpoints')
  old = checkpoint.Checkpointer(src, async_save=False)
  steps = old.all_steps()
  if not steps:
    old.close()
    return 0
  state, _ = old.read(steps[-1])
  if not checkpoint.is_per_layer(list(_paths(state))):
    old.close()
    logging.info('%s: already stacked', run_dir)
    return 0
  spec = train.model_spec(run_dir)
  cfg = train.model_config(spec['preset'], spec.get('overrides') or {})
  tmp = src + '.stacked'
  shutil.rmtree(tmp, ignore_errors=True)
  new = checkpoint.Checkpointer(tmp, max_to_keep=len(steps), async_save=False)
  for step in steps:
    state, extra = old.read(step)
    new.save(step, checkpoint.convert_state(cfg, state), extra)
    logging.info('%s: step %d converted', run_dir, step)
  new.close()
  old.close()
  os.rename(src, src + '.per_layer')
  os.rename(tmp, src)
  return len(steps)


def main(argv):
  del argv
  root = _RUN_DIR.value
  runs = ([root] if os.path.isdir(os.path.join(root, 'checkpoints')) else
          sorted(os.path.join(root, d) for d in os.listdir(root)
                 if os.path.isdir(os.path.join(root, d, 'checkpoints'))))
  if not runs:
    raise app.UsageError(f'{root}: no checkpoints/ in it or its stages')
  for run in runs:
    n = convert_run(run)
    print(f'{run}: {n} checkpoint step(s) converted' if n else
          f'{run}: nothing to convert')


if __name__ == '__main__':
  app.run(main)
