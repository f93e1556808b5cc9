"""Flax NNX MoE decoder: configs, presets, the model, KV cache and parameter counts."""

from cascade_jax.model._attention import Attention
from cascade_jax.model._attention import attention_mask
from cascade_jax.model._config import ATTENTION
from cascade_jax.model._config import MAMBA
from cascade_jax.model._config import MLP
from cascade_jax.model._config import MOE
from cascade_jax.model._attention import rope_tables
from cascade_jax.model._config import MambaConfig
from cascade_jax.model._config import ModelConfig
from cascade_jax.model._config import MoEConfig
from cascade_jax.model._config import NEMOTRON3_NANO_PATTERN
from cascade_jax.model._config import nemotron3_nano_30b_a3b
from cascade_jax.model._config import preset
from cascade_jax.model._config import PRESETS
from cascade_jax.model._config import qwen3_30b_a3b
from cascade_jax.model._config import small
from cascade_jax.model._config import small_hybrid
from cascade_jax.model._config import tiny
from cascade_jax.model._dispatch import capacity as expert_capacity
from cascade_jax.model._dispatch import capacity_slots
from cascade_jax.model._dispatch import combine_weights
from cascade_jax.model._dispatch import DROPLESS_CAPACITY_FACTOR
from cascade_jax.model._dispatch import dropless as dropless_experts
from cascade_jax.model._dispatch import flat_mlp
from cascade_jax.model._dispatch import expert_forward
from cascade_jax.model._dispatch import overflow_chunks
from cascade_jax.model._dispatch import receive_rows
from cascade_jax.model._dispatch import quarter_power_ceil
from cascade_jax.model._dispatch import replay_capacity
from cascade_jax.model._layer_arrays import has_layer_arrays
from cascade_jax.model._layer_arrays import is_layered
from cascade_jax.model._layer_arrays import layer_part
from cascade_jax.model._layer_arrays import layered
from cascade_jax.model._layer_arrays import LayerArrays
from cascade_jax.model._layer_arrays import split_layers
from cascade_jax.model._layer_arrays import split_layers_like
from cascade_jax.model._layer_arrays import split_model
from cascade_jax.model._layer_arrays import stack_layers
from cascade_jax.model._layers import activation
from cascade_jax.model._layers import is_gated
from cascade_jax.model._layers import Mlp
from cascade_jax.model._mamba import Mamba2
from cascade_jax.model._mamba import init_state as mamba_init_state
from cascade_jax.model._mamba import MambaState
from cascade_jax.model._mamba import resets as mamba_resets
from cascade_jax.model._mamba import state_axes as mamba_state_axes
from cascade_jax.model._moe import exact_dispatch
from cascade_jax.model._moe import ExpertBias
from cascade_jax.model._moe import MoE
from cascade_jax.model._moe import route
from cascade_jax.model._moe import update_expert_bias
from cascade_jax.model._params import count_params
from cascade_jax.model._params import ParamCount
from cascade_jax.model._transformer import dropped_fraction
from cascade_jax.model._transformer import spilled_fraction
from cascade_jax.model._transformer import init_cache
from cascade_jax.model._transformer import KVCache
from cascade_jax.model._transformer import Stack
from cascade_jax.model._transformer import abstract_model
from cascade_jax.model._transformer import init_model
from cascade_jax.model._transformer import Transformer
