"""Reports: PNG curves and matrices, and the cascade's forgetting-matrix report."""

from cascade_jax.report._plots import plot_curves
from cascade_jax.report._plots import plot_stage_panels
from cascade_jax.report._plots import StagePanel
from cascade_jax.report._plots import plot_matrix
from cascade_jax.report._plots import read_metrics
from cascade_jax.report._cascade import cascade_report
from cascade_jax.report._cascade import deltas
from cascade_jax.report._cascade import matrix
from cascade_jax.report._cascade import on_policy_check
from cascade_jax.report._cascade import se_of_change
from cascade_jax.report._cascade import cascade_sweep_report
