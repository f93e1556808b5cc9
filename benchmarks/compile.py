"""Compile time against depth, layers unrolled vs scanned (memory.scan_layers): the SFT train step, and its loss gradient alone.

  python -m benchmarks.compile --depths=2,4,8,16

The main job's model (configs/sft.py: small, vocab 1024, '*E' repeated),
one device, batch 8 x 256; each row compiles afresh (no persistent cache).
"""

import time

import jax
import jax.numpy as jnp
from absl import app
from absl import flags
from flax import nnx

from cascade_jax import model
from cascade_jax import sft
from cascade_jax import train
from cascade_jax import utils

_DEPTHS = flags.DEFINE_list('depths', ['2', '4', '8', '16'],
                            'Repeats of the *E unit (layers = 2 x depth).')


def _compile_s(cfg) -> tuple[float, float]:
  """(train step, loss gradient alone) compile seconds."""
  opt = train.make_optimizer(train.OptimConfig())
  graph, state = train.init_state(model.Transformer(cfg, rngs=nnx.Rngs(0)),
                                  opt)
  b, t = 8, 256
  batch = {k: jnp.zeros((b, t), jnp.int32) for k in (
      'inputs', 'targets', 'positions', 'segment_ids', 'mask')}
  t0 = time.perf_counter()
  sft.train_step.lower(state, batch, graph=graph, opt=opt, accum=1,
                       bias_rate=1e-3, n_moe=cfg.pattern.count('E')).compile()
  step_s = time.perf_counter() - t0
  grad = jax.jit(jax.grad(lambda p, b: sft.loss_fn(
      p, state.rest, graph, b, 1.0, 1.0)[0]))
  t0 = time.perf_counter()
  grad.lower(state.params, batch).compile()
  return step_s, time.perf_counter() - t0


def main(argv):
  del argv
  utils.quiet_logs()
  jax.config.update('jax_enable_compilation_cache', False)
  rows = []
  header = ['layers', 'step unrolled s', 'step scanned s',
            'grad unrolled s', 'grad scanned s']
  for d in map(int, _DEPTHS.value):
    cfg = model.small(vocab_size=1024, pattern='*E' * d)
    (su, gu), (ss, gs) = _compile_s(cfg), _compile_s(cfg.replace(
        scan_layers=True))
    rows.append([2 * d, su, ss, gu, gs])
    print(utils.format_table(header, rows[-1:]), flush=True)
  print(utils.format_table(header, rows))


if __name__ == '__main__':
  app.run(main)
