"""Importing a Hugging Face checkpoint (experiments.import_hf): the mesh it lands on and the weights' dtype.

  python -m experiments.import_hf --hf_dir=DIR --workdir=RUN --config.mesh.fsdp=8

Each process reads only the slices of the safetensors files its devices
hold, straight into the rules' shardings (the same `mesh` / `rules` as
every stage), and writes the run's Orbax checkpoint.
"""

import ml_collections

from cascade_jax import train


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.update(train.placement_defaults())
  del c['memory']            # how a stage computes: not the import's business
  # The weights' dtype: '' keeps the checkpoint's (bf16 for the released
  # 30B models), 'float32' for fp32 master weights.
  c.dtype = ''
  # The MoE dispatch the run records: 'dropless' (a plain forward of the
  # restored run equals transformers'), or 'ragged' / 'capacity' / 'dense'.
  c.dispatch = 'dropless'
  return c
