"""The SFT stage: packed next-token training with Orbax checkpoints and resume."""

from cascade_jax.sft._trainer import eval_sets
from cascade_jax.sft._trainer import loss_fn
from cascade_jax.sft._trainer import run
from cascade_jax.sft._trainer import tokenizer_for
from cascade_jax.sft._trainer import train_step
