"""Small shared helpers: timing and tables."""

from cascade_jax.utils._bench import format_table
from cascade_jax.utils._bench import time_fn
from cascade_jax.utils._logs import quiet_logs
