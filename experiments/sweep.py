"""Runs a config file's sweep() one run after another on this machine, then one results table.

  python -m experiments.sweep --experiment=cascade --config=configs/cascade.py \
      --workdir=runs/cascade_seeds
  python -m experiments.sweep --experiment=sft --config=configs/sft.py:quick \
      --workdir=runs/sft_lr --dry_run      # print the commands, run elsewhere

Each run is a normal launch of `experiments.<experiment>` with the sweep's
overrides on the command line and its own directory (<workdir>/<name>), so
the printed commands can be run one by one anywhere. A run already finished
(it resumes) costs nothing to repeat. For the cascade, the table is the
forgetting matrix as mean and spread over the runs (sweep_report.*).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

from absl import app
from absl import flags

from cascade_jax import report
from cascade_jax import utils

_EXPERIMENT = flags.DEFINE_string('experiment', 'cascade',
                                  'experiments/<name>.py to launch.')
_CONFIG = flags.DEFINE_string('config', 'configs/cascade.py',
                              'Config file (with :arg) that defines sweep().')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Sweep directory.',
                               required=True)
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the commands only.')


def load_sweep(config_path: str) -> list[dict]:
  path = config_path.split(':')[0]
  spec = importlib.util.spec_from_file_location('_swept_config', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  if not hasattr(mod, 'sweep'):
    raise ValueError(f'{path} defines no sweep()')
  return list(mod.sweep())


def run_name(overrides: dict) -> str:
  name = ','.join(f"{k.removeprefix('config.')}={v}"
                  for k, v in overrides.items())
  return re.sub(r'[^A-Za-z0-9_.,=-]', '_', name) or 'base'


def main(argv):
  del argv
  runs = load_sweep(_CONFIG.value)
  os.makedirs(_WORKDIR.value, exist_ok=True)
  rows, dirs = [], []
  for i, ov in enumerate(runs):
    wd = os.path.join(_WORKDIR.value, run_name(ov))
    cmd = [sys.executable, '-m', f'experiments.{_EXPERIMENT.value}',
           f'--config={_CONFIG.value}', f'--workdir={wd}'] + [
               f'--{k}={v}' for k, v in ov.items()]
    print(f'[sweep] run {i + 1}/{len(runs)}: python {" ".join(cmd[1:])}',
          flush=True)
    if _DRY_RUN.value:
      continue
    rc = subprocess.call(cmd)
    rows.append([run_name(ov), 'ok' if rc == 0 else f'failed ({rc})', wd])
    if rc == 0:
      dirs.append(wd)
  if _DRY_RUN.value:
    return
  table = utils.format_table(['run', 'status', 'directory'], rows)
  with open(os.path.join(_WORKDIR.value, 'sweep.json'), 'w') as f:
    json.dump(dict(config=_CONFIG.value, experiment=_EXPERIMENT.value,
                   runs=[dict(name=r[0], status=r[1], workdir=r[2])
                         for r in rows]), f, indent=2)
  print(table)
  if _EXPERIMENT.value == 'cascade' and dirs:
    out = report.cascade_sweep_report(dirs, _WORKDIR.value)
    print(f"\n[sweep] forgetting matrix over {len(dirs)} runs (mean ± std): "
          f"{out['markdown']}\n{out['table']}")
  if any(r[1] != 'ok' for r in rows):
    sys.exit(1)


if __name__ == '__main__':
  app.run(main)
