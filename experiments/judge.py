"""Judge stage launcher: a generative pairwise judge on preference pairs from a run's checkpoint.

  python -m experiments.judge --config=configs/judge.py \
      --workdir=runs/judge --config.init_from=runs/sft
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import reward_model
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/judge.py', 'Judge config.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory.',
                               required=True)


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  utils.enable_compilation_cache()
  reward_model.judge_train_run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  app.run(main)
