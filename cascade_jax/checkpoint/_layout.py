"""Checkpoints written before layers were stacked: converted to the stacked layout.

Until the change, a model stored one module per layer (`blocks/<i>/...`);
now each of `ModelConfig.layer_groups` is a `Stack` whose unit positions
carry a leading layer axis (`layers/<g>/blocks/<j>/...`). `stack_layers`
converts a tree of weights, `convert_state` a whole train-state checkpoint
(weights, other variables, and the optimizer's per-parameter moments), and
`experiments.convert_checkpoint` a run directory.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import numpy as np

from cascade_jax.model import ModelConfig

PER_LAYER = re.compile(r'(^|/)blocks/\d+/')
STACKED = re.compile(r'(^|/)layers/\d+/blocks/\d+/')


def is_per_layer(paths) -> bool:
  """Whether '/'-joined checkpoint paths are in the one-module-per-layer layout."""
  return any(PER_LAYER.search(p) and not STACKED.search(p) for p in paths)


def _layer(blocks: dict, i: int):
  for key in (i, str(i)):
    if key in blocks:
      return blocks[key]
  return None


def stack_layers(cfg: ModelConfig, tree: Any,
                 stack: Callable = lambda xs: np.stack(xs)) -> Any:
  """`tree` (nested dicts, as `nnx.State.to_pure_dict` or a raw checkpoint
  read) with every `blocks: {i: layer}` entry restacked as `layers: {g:
  {blocks: {j: stacked}}}`. `stack` combines a stack's layers' leaves."""
  if not isinstance(tree, dict):
    return tree
  out = {k: stack_layers(cfg, v, stack) for k, v in tree.items()
         if k != 'blocks'}
  if 'blocks' not in tree:
    return out
  blocks = tree['blocks']
  extra = sorted(int(k) for k in blocks if int(k) >= cfg.num_layers)
  if extra:
    raise ValueError(f'per-layer checkpoint has layers up to {extra[-1]}, '
                     f'the model {cfg.num_layers} ({cfg.pattern!r})')
  out['layers'], first = {}, 0
  for g, (unit, repeats) in enumerate(cfg.layer_groups):
    p = len(unit)
    stacked = {}
    for j in range(p):
      # A tree of some variables only (e.g. the expert biases) holds some
      # positions: each one whole, or not at all.
      layers = [_layer(blocks, first + k * p + j) for k in range(repeats)]
      if all(x is None for x in layers):
        continue
      if any(x is None for x in layers):
        missing = [first + k * p + j for k, x in enumerate(layers)
                   if x is None]
        raise ValueError(f'per-layer checkpoint lacks layers {missing} '
                         f'({unit[j]!r} layers of the model {cfg.pattern!r})')
      stacked[j] = jax.tree.map(lambda *xs: stack(list(xs)), *layers)
    if stacked:
      out['layers'][g] = {'blocks': stacked}
    first += p * repeats
  return out


def int_keys(tree: Any) -> Any:
  """Nested dicts with digit-string keys (as a checkpoint reads back) keyed
  by ints again, so that leaves come in the order the model's state had."""
  if not isinstance(tree, dict):
    return tree
  return {int(k) if isinstance(k, str) and k.isdigit() else k: int_keys(v)
          for k, v in tree.items()}


def convert_state(cfg: ModelConfig, state: dict) -> dict:
  """A train-state checkpoint (`TrainState.to_checkpoint`: params, rest,
  opt_state as a flat list of leaves, step) in the stacked layout.

  The optimizer's leaves hold each per-parameter statistic (Adam's moments)
  as a run of leaves in the parameters' order: every such run is restacked
  the way the parameters are; other leaves (counts) are kept.
  """
  state = {k: int_keys(v) if isinstance(v, dict) else v
           for k, v in state.items()}
  params = state['params']
  old = jax.tree.leaves(params)
  # Which old leaves make each new leaf: trace indices through the stacking.
  ids = jax.tree.unflatten(jax.tree.structure(params), range(len(old)))
  traced = stack_layers(cfg, ids, stack=tuple)
  is_tuple = lambda x: isinstance(x, tuple)
  recipe = jax.tree.leaves(traced, is_leaf=is_tuple)
  remake = lambda leaves: [
      np.stack([np.asarray(leaves[i]) for i in r]) if isinstance(r, tuple)
      else leaves[r] for r in recipe]
  out = dict(state)
  out['params'] = jax.tree.unflatten(
      jax.tree.structure(traced, is_leaf=is_tuple), remake(old))
  out['rest'] = stack_layers(cfg, state.get('rest', {}))
  if 'opt_state' in state:
    shapes = [np.shape(x) for x in old]
    leaves, opt, s = list(state['opt_state']), [], 0
    while s < len(leaves):
      run = leaves[s:s + len(old)]
      if len(run) == len(old) and [np.shape(x) for x in run] == shapes:
        opt += remake(run)
        s += len(old)
      else:
        opt.append(leaves[s])
        s += 1
    out['opt_state'] = opt
  return out


__all__ = ['convert_state', 'int_keys', 'is_per_layer', 'stack_layers']
