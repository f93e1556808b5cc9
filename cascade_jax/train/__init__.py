"""What every stage shares: its set-up (mesh, models, checkpoints, metrics), train state, optimizer, LM quantities."""

from cascade_jax.train._lm import token_entropy
from cascade_jax.train._lm import token_logprobs
from cascade_jax.train._lm import token_stats
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
from cascade_jax.train._restore import abstract_model
from cascade_jax.train._setup import is_main_process
from cascade_jax.train._setup import memory_overrides
from cascade_jax.train._setup import mesh_ctx
from cascade_jax.train._setup import placement_defaults
from cascade_jax.train._setup import resolve
from cascade_jax.train._setup import Setup
from cascade_jax.train._state import opt_state_shardings
