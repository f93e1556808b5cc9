"""SFT stage launcher: next-token training on packed chat data, then per-domain evaluation.

  python -m experiments.sft --config=configs/sft.py --workdir=runs/sft
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import sft
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/sft.py', 'SFT config.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory.',
                               required=True)


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  utils.enable_compilation_cache()
  sft.run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  app.run(main)
