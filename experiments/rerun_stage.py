"""One RL stage of a finished cascade again (e.g. with other hyperparameters), against its start.

  python -m experiments.rerun_stage --config=configs/cascade.py \
      --run=runs/cascade --stage=if_rl --workdir=runs/if_rl_16 \
      --config.stages.if_rl.rl.prompts_per_step=16

The stage starts from the run's checkpoint of its own starting stage (or
--init_from), with the run's reward model and teachers; both ends are scored
on every domain as the cascade scores a stage (--config.eval_n,
--config.eval_samples) and compared prompt by prompt; * marks the stage's
own domains.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import cascade
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/cascade.py', 'The cascade config the run used.',
    lock_config=True)
_RUN = flags.DEFINE_string('run', None, 'A cascade run directory.',
                           required=True)
_STAGE = flags.DEFINE_string('stage', None, 'The RL stage to rerun.',
                             required=True)
_INIT = flags.DEFINE_string('init_from', '', 'Start from this stage of the '
                            "run instead of the stage's own start.")
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where the rerun writes.',
                               required=True)
_SEED = flags.DEFINE_integer('stage_seed', None, "The stage's training seed "
                             "(default: the cascade's); the evaluation keeps "
                             "the cascade's.")


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  utils.enable_compilation_cache()
  rows = cascade.rerun_stage(_CONFIG.value, _RUN.value, _STAGE.value,
                             _WORKDIR.value, init_from=_INIT.value,
                             stage_seed=_SEED.value)
  print(cascade.rerun_table(rows))

if __name__ == '__main__':
  app.run(main)
