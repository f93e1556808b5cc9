"""Orbax checkpoints: train state (arrays) + JSON side data (data iterator, config), with keep-N and resume."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from cascade_jax.checkpoint._layout import is_per_layer


def _key(entry) -> str:
  for attr in ('key', 'idx', 'name'):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def _shapes(tree) -> dict[str, tuple]:
  # Paths as 'a/0/b': saved dict keys come back as strings, so int and str
  # keys must compare equal.
  return {'/'.join(_key(e) for e in path): tuple(np.shape(v)) for path, v in
          jax.tree_util.tree_leaves_with_path(tree)}


class Checkpointer:
  """Periodic, atomic, keep-N checkpoints of one run (a thin CheckpointManager).

  Each step holds `state` (a pytree of arrays: params, optimizer state, ...)
  and `extra` (JSON: data iterator state, metrics). A killed save leaves no
  half-written step behind: Orbax finalises a step by renaming it.
  """

  def __init__(self, directory: str, *, max_to_keep: int = 3,
               async_save: bool = True,
               save_concurrent_gb: float | None = None):
    """`save_concurrent_gb`: at most this many GB of arrays in flight
    (copied to the host, being written) during a save; Orbax's default
    (96) lets a save copy every array at once."""
    self.directory = os.path.abspath(directory)
    handler = (ocp.StandardCheckpointHandler() if save_concurrent_gb is None
               else ocp.StandardCheckpointHandler(
                   save_concurrent_gb=save_concurrent_gb))
    self._mngr = ocp.CheckpointManager(
        self.directory,
        # Named handlers: a fresh process can read metadata before restoring.
        item_handlers=dict(state=handler,
                           extra=ocp.JsonCheckpointHandler()),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True,
            enable_async_checkpointing=async_save))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def read(self, step: int | None = None) -> tuple[dict, dict]:
    """(state, extra) of a step (default: the latest) as saved, on one
    device, without a model to restore into (to compare runs, inspect)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f'no checkpoint in {self.directory}')
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), extra=ocp.args.JsonRestore()))
    return out['state'], dict(out['extra'] or {})

  def save(self, step: int, state: Any, extra: dict | None = None) -> None:
    self._mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        extra=ocp.args.JsonSave(extra or {})))

  def restore(self, state_like: Any, step: int | None = None, *,
              partial: bool = False) -> tuple[Any, dict]:
    """Restores into the structure, shapes and shardings of `state_like`.

    `state_like` may hold arrays or jax.ShapeDtypeStruct (with shardings).
    With `partial`, it may name a subset of the saved top-level entries
    (e.g. the weights without the optimizer state): only those are read.
    A checkpoint that does not fit raises ValueError naming what differs.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f'no checkpoint in {self.directory}')
    saved = _shapes(self._mngr.item_metadata(step)['state'])
    want = _shapes(state_like)
    if is_per_layer(saved) and not is_per_layer(want):
      run = os.path.dirname(self.directory)
      raise ValueError(
          f'checkpoint {self.directory} step {step} stores one module per '
          'layer (blocks/<i>/...), written before the layers were stacked '
          '(layers/<g>/blocks/<j>/...). Convert the run once with: python -m '
          f'experiments.convert_checkpoint --run_dir={run}')
    problems = [f'{k}: checkpoint {saved[k]} vs model {want[k]}'
                for k in want if k in saved and saved[k] != want[k]]
    problems += [f'{k}: missing from the checkpoint' for k in want
                 if k not in saved]
    problems += [f'{k}: in the checkpoint, not in the model' for k in saved
                 if k not in want and not (partial and k.split('/')[0]
                                           not in state_like)]
    if problems:
      raise ValueError(
          f'checkpoint {self.directory} step {step} does not fit the model '
          f'({len(problems)} differences), e.g. ' + '; '.join(problems[:5]))
    abstract = jax.tree.map(
        lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else
        jax.ShapeDtypeStruct(np.shape(x), x.dtype,
                             sharding=getattr(x, 'sharding', None)),
        state_like)
    if partial:
      return self._restore_partial(step, abstract)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract),
        extra=ocp.args.JsonRestore()))
    return out['state'], dict(out['extra'] or {})

  def _restore_partial(self, step: int, abstract: Any) -> tuple[Any, dict]:
    # The manager's handler restores whole trees; a subset goes through a
    # PyTree checkpointer on the step's `state` item directly.
    path = os.path.join(self.directory, str(step), 'state')
    with ocp.PyTreeCheckpointer() as ckptr:
      state = ckptr.restore(path, args=ocp.args.PyTreeRestore(
          item=abstract,
          restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
          partial_restore=True))
    extra = self._mngr.restore(step, args=ocp.args.Composite(
        extra=ocp.args.JsonRestore()))['extra']
    return state, dict(extra or {})

  def wait(self) -> None:
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()
