"""Imports a Hugging Face checkpoint (Qwen3-MoE, Nemotron-H) as a run directory any stage can start from.

  python -m experiments.import_hf --hf_dir=/ckpt/Qwen3-30B-A3B --workdir=runs/qwen3 \
      --config.mesh.fsdp=8
  # the dtype the weights are kept in ('' keeps the checkpoint's), the MoE dispatch:
  python -m experiments.import_hf --hf_dir=DIR --workdir=RUN --config.dtype=float32

The safetensors files (one, or shards with `model.safetensors.index.json`)
are read lazily: each process reads only the slices its own devices hold,
one device's slice at a time, so neither a host nor a device ever holds a
whole model. On several hosts run the same command on each (the launch
flags of every stage: --coordinator_address, --num_processes, ...).
`train.restore_run(RUN)` then returns (config, model, tokenizer).
"""

import time

from absl import app
from absl import flags
from ml_collections import config_flags

from cascade_jax import train
from cascade_jax import utils
from experiments import _launch

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/import_hf.py', 'Import config (mesh, rules, dtype).',
    lock_config=True)
_HF_DIR = flags.DEFINE_string('hf_dir', None, 'A Hugging Face checkpoint '
                              'directory (config.json + safetensors).',
                              required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The run directory to write.',
                               required=True)


def main(argv):
  del argv
  utils.quiet_logs()
  _launch.start()
  config = _CONFIG.value
  start = time.time()
  ctx = train.mesh_ctx(config)
  cfg, _ = train.import_hf(_HF_DIR.value, _WORKDIR.value, ctx=ctx,
                           dtype=config.dtype, dispatch=config.dispatch,
                           settings=config.to_dict())
  if train.is_main_process():
    print(f'[import_hf] {cfg.num_layers} layers ({cfg.pattern}), '
          f'{cfg.param_dtype}, into {_WORKDIR.value} in '
          f'{time.time() - start:.1f}s', flush=True)


if __name__ == '__main__':
  app.run(main)
