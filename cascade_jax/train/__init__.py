"""What the SFT and RL learners share: train state, optimizer, LM quantities."""

from cascade_jax.train._lm import masked_nll_sum
from cascade_jax.train._lm import token_entropy
from cascade_jax.train._lm import token_logprobs
from cascade_jax.train._state import init_state
from cascade_jax.train._state import make_optimizer
from cascade_jax.train._state import model_config
from cascade_jax.train._state import OptimConfig
from cascade_jax.train._state import resume
from cascade_jax.train._state import schedule
from cascade_jax.train._state import TrainState
from cascade_jax.train._restore import restore_latest
from cascade_jax.train._restore import restore_run
from cascade_jax.train._restore import model_shell
from cascade_jax.train._restore import model_spec
