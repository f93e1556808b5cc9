"""The cascade: stages as config data, run in order, scored on every domain after each."""

from cascade_jax.cascade._plan import KINDS
from cascade_jax.cascade._plan import plan
from cascade_jax.cascade._plan import Stage
from cascade_jax.cascade._run import rerun_stage
from cascade_jax.cascade._run import rerun_table
from cascade_jax.cascade._run import eval_sets
from cascade_jax.cascade._run import run
from cascade_jax.cascade._run import score_stage
from cascade_jax.cascade._run import stage_dir
