"""Hand-written kernels: CPU ones behind XLA's FFI, with XLA fallbacks (the sparse MoE expert FFN, KV-cache attention, argmax), and a Pallas TPU decode attention."""

from cascade_jax.kernels._argmax_cpu import argmax
from cascade_jax.kernels._build import built
from cascade_jax.kernels._build import cache_path
from cascade_jax.kernels._build import DISABLE_ENV
from cascade_jax.kernels._decode_attention_tpu import BLOCKS as DECODE_ATTENTION_BLOCKS
from cascade_jax.kernels._decode_attention_tpu import block_for as decode_attention_block
from cascade_jax.kernels._decode_attention_tpu import decode_attention
from cascade_jax.kernels._argmax_cpu import argmax_available
from cascade_jax.kernels._attention_cpu import cache_attention
from cascade_jax.kernels._attention_cpu import cache_attention_available
from cascade_jax.kernels._moe_cpu import moe_ffn
from cascade_jax.kernels._moe_cpu import moe_ffn_available
