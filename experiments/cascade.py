"""The main job: the whole cascade (SFT -> ... -> SWE RL) end to end, then its report.

  python -m experiments.cascade --config=configs/cascade.py --workdir=runs/cascade

Run the same command again after a kill: finished stages are skipped and
the unfinished one resumes from its last checkpoint.
"""

import time

import jax
from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import cascade
from cascade_jax import report
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/cascade.py', 'Cascade config.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', 'runs/cascade', 'Run directory.')


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  utils.enable_compilation_cache()
  t0 = time.perf_counter()
  meta = utils.provenance()
  records = cascade.run(_CONFIG.value, _WORKDIR.value)
  if jax.process_index():   # process 0 writes the report
    return
  meta.update(wall_s=time.perf_counter() - t0, seed=_CONFIG.value.seed,
              workdir=_WORKDIR.value)
  out = report.cascade_report(_WORKDIR.value, records, meta=meta)
  print(f'\n[cascade] finished in {time.perf_counter() - t0:.0f}s; report: '
        f"{out['markdown']}\n")
  print(out['table'])


if __name__ == '__main__':
  app.run(main)
