"""Checkpoints: Orbax save / restore of runs, Hugging Face import / export."""

from cascade_jax.checkpoint._hf import checkpoint_dtype
from cascade_jax.checkpoint._hf import load_hf
from cascade_jax.checkpoint._hf_nemotron_h import config_from_hf_nemotron_h
from cascade_jax.checkpoint._hf_nemotron_h import load_hf_nemotron_h
from cascade_jax.checkpoint._hf_nemotron_h import save_hf_nemotron_h
from cascade_jax.checkpoint._hf_qwen3 import config_from_hf
from cascade_jax.checkpoint._hf_qwen3 import load_hf_qwen3_moe
from cascade_jax.checkpoint._hf_qwen3 import save_hf_qwen3_moe
from cascade_jax.checkpoint._layout import convert_state
from cascade_jax.checkpoint._layout import int_keys
from cascade_jax.checkpoint._layout import is_per_layer
from cascade_jax.checkpoint._layout import stack_layers
from cascade_jax.checkpoint._orbax import Checkpointer
from cascade_jax.checkpoint._safetensors import Files as SafetensorsFiles
