"""Metrics: JSONL + TensorBoard writer and progress lines."""

from cascade_jax.metrics._writer import MetricsWriter
from cascade_jax.metrics._writer import NullWriter
from cascade_jax.metrics._writer import Progress
