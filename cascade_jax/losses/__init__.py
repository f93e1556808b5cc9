"""Pure loss functions (arrays in, arrays out): group advantages, GRPO, MOPD."""

from cascade_jax.losses._rl import group_advantages
from cascade_jax.losses._rl import grpo_loss
from cascade_jax.losses._rl import mopd_loss
from cascade_jax.losses._reward import bradley_terry_loss
