"""One stage set-up for every stage kind (SFT, GRPO / MOPD, reward model).

A stage's config carries, besides its own fields:

  mesh     mesh axis -> size (default data -1: every device on `data`)
  rules    logical axis -> mesh axes ('data,fsdp'; '' replicates), over
           `sharding.DEFAULT_RULES`
  memory   how models compute (none of it changes a checkpoint):
           remat ('none' | 'full' | 'save_dots' | 'save_dots_no_batch'),
           scan_layers, logits_chunk (positions per output-head chunk),
           compute_dtype ('' keeps the model's; 'bfloat16' over float32
           weights is bf16 compute with fp32 master weights and optimizer
           state)

`Setup` turns that into the stage's mesh, its models (new, or restored
from a run directory straight into their shardings: policy, reference,
teachers, reward-model backbone alike), batches placed on the mesh, the
train state with its optimizer state sharded like the weights, Orbax
checkpoints and the metrics writer. Every process of a multi-host run
builds the same set-up; only process 0 writes files besides checkpoints.

A stage directory holds `config.json` (the stage's config), `model.json`
(the model it trains: preset + overrides), `tokenizer.model` and
`checkpoints/`: all a later stage, an evaluation or a teacher needs.
Run paths in a config (`init_from`, `teachers`, `reward_model`) that are
relative resolve against `root` (the cascade's directory; '' for the
current one), so a moved cascade directory still resumes.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx

from cascade_jax import checkpoint
from cascade_jax import metrics as metrics_lib
from cascade_jax import model as model_lib
from cascade_jax import ops
from cascade_jax import sharding
from cascade_jax.train import _restore
from cascade_jax.train import _state

MEMORY_FIELDS = ('remat', 'scan_layers', 'logits_chunk', 'compute_dtype')


def placement_defaults() -> dict:
  """The `mesh`, `rules` and `memory` fields every stage config has."""
  return dict(
      mesh=ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1,
                                          tensor=1)),
      rules=ml_collections.ConfigDict(
          {k: ','.join(sharding.ShardingCtx.axes_tuple(v))
           for k, v in sharding.DEFAULT_RULES}),
      memory=ml_collections.ConfigDict(dict(
          remat='none', scan_layers=False, logits_chunk=0, compute_dtype='')))


def memory_overrides(config) -> dict:
  """ModelConfig fields from a config's `memory` (unknown keys are errors)."""
  mem = dict(config.get('memory') or {})
  unknown = sorted(set(mem) - set(MEMORY_FIELDS))
  if unknown:
    raise ValueError(f'memory: unknown keys {unknown}; known: {MEMORY_FIELDS}')
  out = {k: mem[k] for k in ('remat', 'scan_layers', 'logits_chunk')
         if k in mem}
  if mem.get('compute_dtype'):
    out['dtype'] = mem['compute_dtype']
  return out


def mesh_ctx(config, devices=None, shape=None) -> sharding.ShardingCtx | None:
  """The stage's mesh and rules over `devices` (default: all the run's); None
  on one device (or with no `mesh`). `shape`: another mesh shape than the
  config's `mesh` (an RL stage's sampler on devices of its own)."""
  if shape is None:
    shape = dict(config.mesh.to_dict()) if config.get('mesh') else {}
  rules = sharding.rules_from_config(
      config.rules.to_dict() if config.get('rules') else None)
  count = jax.device_count() if devices is None else len(devices)
  if not shape or count == 1:
    return None
  return sharding.ShardingCtx(sharding.make_mesh(shape, devices), rules)


def is_main_process() -> bool:
  return jax.process_index() == 0


def resolve(path: str, root: str = '') -> str:
  """A run path of a config: relative ones against `root` (if given)."""
  if not path or os.path.isabs(path) or not root:
    return path
  return os.path.join(root, path)


def write_model_json(run_dir: str, spec: dict) -> None:
  """Records the run's model (preset + overrides) in its directory."""
  if not is_main_process():
    return
  with open(os.path.join(run_dir, 'model.json.tmp'), 'w') as f:
    json.dump(dict(preset=spec['preset'],
                   overrides=dict(spec.get('overrides') or {})), f, indent=2)
  os.replace(os.path.join(run_dir, 'model.json.tmp'),
             os.path.join(run_dir, 'model.json'))


@dataclasses.dataclass
class Setup:
  """A stage's mesh, models, batches, state, checkpoints and metrics."""
  config: ml_collections.ConfigDict
  workdir: str
  name: str
  ctx: sharding.ShardingCtx | None
  memory: dict
  ckpt: checkpoint.Checkpointer

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, workdir: str, *,
             name: str, devices=None) -> 'Setup':
    """The stage's set-up, its mesh over `devices` (default: all). A
    one-device stage (no mesh) runs on JAX's default device: `devices`
    then begin with it (an RL stage's learner takes the first ones)."""
    os.makedirs(workdir, exist_ok=True)
    if is_main_process():
      # `root` locates the cascade: not part of what the stage is.
      saved = ml_collections.ConfigDict(config.to_dict())
      if 'root' in saved:
        del saved['root']
      with open(os.path.join(workdir, 'config.json'), 'w') as f:
        f.write(saved.to_json_best_effort(indent=2))
    # The run's CPU kernels: a resumed run keeps those it started with.
    ops.keep_run_kernels(workdir)
    ctx = mesh_ctx(config, devices)
    ckpt = checkpoint.Checkpointer(
        os.path.join(workdir, 'checkpoints'),
        max_to_keep=config.get('keep_checkpoints', 3))
    setup = cls(config, workdir, name, ctx, memory_overrides(config), ckpt)
    setup.log_mesh()
    return setup

  def log_mesh(self) -> None:
    """One line: the stage's mesh, its devices and processes (none on one
    device)."""
    if self.ctx is not None:
      print(f'[{self.name}] mesh {dict(self.ctx.mesh.shape)} over '
            f'{self.ctx.mesh.devices.size} devices, {jax.process_count()} '
            'process(es)', flush=True)

  # ------------------------------------------------------------ paths

  def path(self, run_path: str) -> str:
    return resolve(run_path, self.config.get('root', ''))

  # ----------------------------------------------------------- models

  def new_model(self, spec: dict, seed: int):
    """(model config, a freshly initialised model placed on the mesh)."""
    cfg = _state.model_config(spec['preset'], spec.get('overrides') or {})
    cfg = cfg.replace(**self.memory)
    # On a mesh, initialised under jit straight into its shardings.
    model = model_lib.init_model(cfg, seed, self.ctx)
    write_model_json(self.workdir, spec)
    return cfg, model

  def restore(self, run_path: str, *, record: bool = False):
    """(model config, model, tokenizer) of a run, on this stage's mesh.

    The weights are read straight into their shardings. `record`: this
    stage trains that model (its model.json and tokenizer become ours).
    """
    run_dir = self.path(run_path)
    cfg, model, tok = _restore.restore_run(run_dir, ctx=self.ctx,
                                           memory=self.memory)
    if tok is None:
      raise ValueError(
          f'{self.name}: {run_dir} has no tokenizer (tokenizer.model or '
          'hf_tokenizer/tokenizer.json), and a stage needs one: import the '
          'checkpoint with its tokenizer files')
    if record:
      write_model_json(self.workdir, _restore.model_spec(run_dir))
      if is_main_process():
        _restore.copy_tokenizer(run_dir, self.workdir)
    return cfg, model, tok

  # ---------------------------------------------------- data and state

  def put(self, batch):
    """A host batch (a pytree of [B, ...] numpy arrays, the same on every
    process) on the mesh, every leaf split by rows over the `batch` rule's
    axes; one explicit transfer."""
    if self.ctx is None:
      return jax.device_put(batch)
    n = self.ctx.shards('batch')

    def put(path, v):
      v = np.asarray(v)
      if v.ndim and v.shape[0] % n:
        raise ValueError(
            f'{self.name}: batch {jax.tree_util.keystr(path)} has '
            f'{v.shape[0]} rows, not a multiple of the {n} devices its '
            f"'batch' axes {self.ctx.mesh_axes('batch')} split it over")
      axes = ('batch',) + (None,) * (v.ndim - 1)
      return sharding.put(v, self.ctx.sharding(axes[:v.ndim], v.shape))
    return jax.tree_util.tree_map_with_path(put, batch)

  def init_state(self, model: nnx.Module, opt: optax.GradientTransformation):
    return _state.init_state(model, opt)

  def resume(self, state: _state.TrainState):
    """(state, extra): the latest checkpoint into `state`'s layout and
    shardings, or (state, None) on a fresh start."""
    return _state.resume(self.ckpt, state)

  def save(self, step: int, state: _state.TrainState, extra: dict) -> None:
    self.ckpt.save(step, state.to_checkpoint(), extra)

  # ---------------------------------------------------------- outputs

  def writer(self, keep=None):
    if not is_main_process():
      return metrics_lib.NullWriter()
    return metrics_lib.MetricsWriter(self.workdir, name=self.name, keep=keep)

  def write_json(self, filename: str, value) -> None:
    if is_main_process():
      with open(os.path.join(self.workdir, filename), 'w') as f:
        json.dump(value, f, indent=2)

  def close(self) -> None:
    self.ckpt.close()
