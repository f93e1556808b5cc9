"""Exports a run's latest weights as a Hugging Face checkpoint (Qwen3-MoE or Nemotron-H layout).

  python -m experiments.export_hf --run=runs/cascade/swe_agent_rl --out=/ckpt/ours
  python -m experiments.export_hf --run=RUN --out=DIR --dtype=float32 --config.mesh.fsdp=8

The run's model is restored onto the mesh (`--config`: the import's mesh
and rules), then written a tensor at a time: safetensors shards of at most
`--max_shard_gb` with `model.safetensors.index.json`, bf16 by default, and
config.json; transformers' `from_pretrained` reads the directory. The
architecture follows the model: '*E' / '*-' layers with RoPE and QK-norm
are Qwen3-MoE, Mamba-2 hybrids Nemotron-H (anything else is refused by
name). A run imported with experiments.import_hf gets its tokenizer files
back.
"""

import os
import shutil
import time

import jax
from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import checkpoint
from cascade_jax import model as model_lib
from cascade_jax import train
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/import_hf.py', 'Mesh and rules to restore onto.',
    lock_config=True)
_RUN = flags.DEFINE_string('run', None, 'A run directory.', required=True)
_OUT = flags.DEFINE_string('out', None, 'The directory to write.',
                           required=True)
_DTYPE = flags.DEFINE_string('dtype', 'bfloat16', "The files' dtype ('' "
                             "keeps the run's).")
_SHARD = flags.DEFINE_float('max_shard_gb', 4.0, 'Largest file, in GB.')


def export(run: str, out: str, *, dtype: str = 'bfloat16', ctx=None,
           max_shard_bytes: int = 4 << 30) -> list[str]:
  """Writes `run`'s latest weights to `out`; returns the weight files."""
  if jax.process_count() > 1:
    raise ValueError('export_hf runs as one process (its mesh: that '
                     "process's devices); got "
                     f'{jax.process_count()} processes')
  cfg, model, _ = train.restore_run(run, ctx=ctx)
  save = (checkpoint.save_hf_nemotron_h if model_lib.MAMBA in cfg.pattern
          else checkpoint.save_hf_qwen3_moe)
  files = save(cfg, model, out, dtype=dtype, max_shard_bytes=max_shard_bytes)
  tok = os.path.join(run, 'hf_tokenizer')
  if os.path.isdir(tok):
    for name in os.listdir(tok):
      shutil.copy(os.path.join(tok, name), os.path.join(out, name))
  return files


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  start = time.time()
  files = export(_RUN.value, _OUT.value, dtype=_DTYPE.value,
                 ctx=train.mesh_ctx(_CONFIG.value),
                 max_shard_bytes=int(_SHARD.value * 1e9))
  print(f'[export_hf] {len(files)} files into {_OUT.value} in '
        f'{time.time() - start:.1f}s', flush=True)


if __name__ == '__main__':
  app.run(main)
