"""The sandbox for model-written code: isolation, limits, harness verdicts, a pool."""

from cascade_jax.sandbox._sandbox import Limits
from cascade_jax.sandbox._sandbox import SANDBOX_ERROR
from cascade_jax.sandbox._sandbox import Sandbox
from cascade_jax.sandbox._sandbox import ScriptResult
from cascade_jax.sandbox._sandbox import TestResult
