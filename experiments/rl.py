"""RL stage launcher: GRPO (or MOPD) on one domain from a previous run's checkpoint.

  python -m experiments.rl --config=configs/rl.py --workdir=runs/rl_math \
      --config.init_from=runs/sft
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import rl
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/rl.py', 'RL stage config.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory.',
                               required=True)


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  utils.enable_compilation_cache()
  rl.run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  app.run(main)
