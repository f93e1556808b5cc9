"""The rollout engine: jitted KV-cache sampling shared by RL and evaluation."""

from cascade_jax.rollout._benchmark import moe_decode_benchmark
from cascade_jax.rollout._decode import decode_forward
from cascade_jax.rollout._decode import decode_weights
from cascade_jax.rollout._decode import DecodeWeights
from cascade_jax.rollout._decode import forward
from cascade_jax.rollout._decode import model_decode_weights
from cascade_jax.rollout._decode import moe_step
from cascade_jax.rollout._decode import PREFILL_ROWS_PER_EXPERT
from cascade_jax.rollout._sampler import generate
from cascade_jax.rollout._sampler import generate_padded
from cascade_jax.rollout._sampler import keep_top_n
from cascade_jax.rollout._sampler import pad_prompts
from cascade_jax.rollout._sampler import process_logits
from cascade_jax.rollout._sampler import Rollout
from cascade_jax.rollout._sampler import SampleConfig
from cascade_jax.rollout._sampler import trace_count
from cascade_jax.rollout._sampler import truncates
from cascade_jax.rollout._evaluate import evaluate_and_log
from cascade_jax.rollout._evaluate import evaluate_model
from cascade_jax.rollout._evaluate import max_new_tokens_for
from cascade_jax.rollout._evaluate import responses_for
