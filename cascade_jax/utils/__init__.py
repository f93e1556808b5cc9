"""Small shared helpers: timing, tables, benchmark results, provenance."""

from cascade_jax.utils._bench import format_table
from cascade_jax.utils._bench import time_fn
from cascade_jax.utils._bench import write_results
from cascade_jax.utils._compiles import compile_seconds
from cascade_jax.utils._compiles import CompileCounter
from cascade_jax.utils._logs import apply_jax_settings
from cascade_jax.utils._logs import enable_compilation_cache
from cascade_jax.utils._logs import jax_settings
from cascade_jax.utils._logs import quiet_logs
from cascade_jax.utils._distributed import cluster_environment
from cascade_jax.utils._distributed import initialize as initialize_distributed
from cascade_jax.utils._process import stop_process
from cascade_jax.utils._provenance import cpu_model
from cascade_jax.utils._provenance import provenance
from cascade_jax.utils._provenance import vector_isa
