"""One function per heavy op; each picks its implementation by backend and dtype.

  grouped_matmul   xla (CPU) | tokamax (GPU, TPU)
  attention        xla (CPU, fp32) | cudnn (GPU) | splash (TPU) | tokamax
  cache_attention  pallas (TPU: the written blocks, scores kept in VMEM) |
                   xla | cpu_kernel (CPU fp32, where measured faster) |
                   xla_written (forced only: a long cache's written blocks)
  prefill_attention  cache (CPU: cache_attention over every slot) | fused
                   (GPU, TPU: the new tokens over themselves, `attention`)
  moe_decode       xla (the sampler's layouts) | cpu_kernel (likewise)
  argmax           xla | cpu_kernel (likewise)
  token_logprobs   xla
  ssd              xla (Mamba-2's chunked scan and its one-token step)
  expert_exchange  all_gather (CPU) | ragged_all_to_all (GPU, TPU)

`selected()` says what ran; `configure(attention='xla')`, a config's `ops`
section or CASCADE_JAX_OPS='attention=xla' forces a choice;
`set_strict(True)` (a config's `ops_strict`, CASCADE_JAX_OPS_STRICT=1) makes
a fallback from the backend's preferred kernel an error. The reference of
each op is its 'xla' implementation (prefill_attention's: 'cache'); tests
hold the others equal to it.
"""

from cascade_jax.ops._attention import apply_rope
from cascade_jax.ops._attention import attention
from cascade_jax.ops._attention import attention_mask
from cascade_jax.ops._attention import cache_attention
from cascade_jax.ops._attention import cache_slots
from cascade_jax.ops._attention import prefill_attention
from cascade_jax.ops._attention import rms_norm
from cascade_jax.ops._attention import write_at
from cascade_jax.ops._collectives import axis_index
from cascade_jax.ops._collectives import expert_exchange
from cascade_jax.ops._collectives import ragged_all_to_all
from cascade_jax.ops._cpu import calibration as cpu_kernel_calibration
from cascade_jax.ops._cpu import KERNEL_OPS as CPU_KERNEL_OPS
from cascade_jax.ops._cpu import in_use as cpu_kernels_in_use
from cascade_jax.ops._cpu import keep_run_kernels
from cascade_jax.ops._cpu import kernel_enabled as cpu_kernel_enabled
from cascade_jax.ops._cpu import register_decode_benchmark
from cascade_jax.ops._decode import argmax
from cascade_jax.ops._decode import moe_decode_uses_kernel
from cascade_jax.ops._decode import moe_ffn
from cascade_jax.ops._decode import moe_ffn_available
from cascade_jax.ops._logprobs import token_logprobs
from cascade_jax.ops._matmul import grouped_matmul
from cascade_jax.ops._matmul import round_rows
from cascade_jax.ops._matmul import row_tile
from cascade_jax.ops._ssd import ssd
from cascade_jax.ops._ssd import ssd_step
from cascade_jax.ops._registry import configure
from cascade_jax.ops._registry import configured
from cascade_jax.ops._registry import elsewhere
from cascade_jax.ops._registry import FallbackError
from cascade_jax.ops._registry import forced
from cascade_jax.ops._registry import IMPLEMENTATIONS
from cascade_jax.ops._registry import parse
from cascade_jax.ops._registry import reset_selected
from cascade_jax.ops._registry import selected
from cascade_jax.ops._registry import set_strict
from cascade_jax.ops._registry import strict
from cascade_jax.ops._registry import strict_mode
