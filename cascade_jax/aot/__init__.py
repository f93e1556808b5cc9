"""Ahead-of-time plans: per-device memory, FLOPs and step-time estimates of every step on a mesh."""

from cascade_jax.aot._report import ACCELERATORS
from cascade_jax.aot._steps import abstract_train_state
from cascade_jax.aot._plan import attention_context
from cascade_jax.aot._plan import compile_step
from cascade_jax.aot._plan import devices
from cascade_jax.aot._report import from_results
from cascade_jax.aot._plan import libtpu_available
from cascade_jax.aot._plan import model_config
from cascade_jax.aot._plan import run
from cascade_jax.aot._plan import mesh_shapes
from cascade_jax.aot._plan import model_flops
from cascade_jax.aot._plan import per_device_bytes
from cascade_jax.aot._report import StepCost
from cascade_jax.aot._steps import STEPS
from cascade_jax.aot._report import table
