"""Reward-model stage launcher: a Bradley-Terry model on preference pairs from a run's checkpoint.

  python -m experiments.reward_model --config=configs/reward_model.py \
      --workdir=runs/rm --config.init_from=runs/sft
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import reward_model
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/reward_model.py', 'Reward model config.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory.',
                               required=True)


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  utils.enable_compilation_cache()
  reward_model.train_run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  app.run(main)
