"""Hand-written CPU kernels behind XLA's FFI, with XLA fallbacks: the sparse MoE expert FFN."""

from cascade_jax.kernels._moe_cpu import moe_ffn
from cascade_jax.kernels._moe_cpu import moe_ffn_available
