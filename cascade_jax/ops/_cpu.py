"""When the CPU kernels run: never where they are slower than XLA's own ops.

The kernels (`cascade_jax.kernels`) were written for 16-float (AVX-512)
vectors. On an AVX2 EPYC they ran 2-5x slower than XLA's path (issue 16:
one MoE decode step at batch 64, 6,880 us against 1,470 us), on an AVX-512
machine up to 2x faster. So, per kernel, CASCADE_JAX_CPU_KERNELS says:

- unset or 'auto' (the default): a calibration, run once per machine and
  kernel build (2-12 s: it stops at a kernel's first loss) and cached
  beside the library, times each kernel against XLA's ops on the main
  job's shapes, at decode batch 64 then 8, and keeps only those faster by
  at least 10 % at both;
- '1': every kernel that builds (tests, benchmarks);
- '0': none: XLA's ops alone, the path accelerator users run.

The decision is printed once per process, one line, with the figures.
Because it is cached, it is the same in a resumed run as in the run that
was killed (the kernels and XLA round differently).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
from absl import logging

from cascade_jax import kernels
from cascade_jax import utils
from cascade_jax.ops import _registry

ENV = kernels.DISABLE_ENV  # CASCADE_JAX_CPU_KERNELS
KERNEL_OPS = ('moe_decode', 'cache_attention', 'argmax')
# A kernel must beat XLA by this factor at every calibrated size.
MARGIN = 0.9
_CALIBRATION_VERSION = 3


def mode() -> str:
  """'auto', 'on' or 'off', from CASCADE_JAX_CPU_KERNELS."""
  v = os.environ.get(ENV, 'auto').strip().lower()
  if v in ('', 'auto'):
    return 'auto'
  if v in ('1', 'on', 'true'):
    return 'on'
  if v in ('0', 'off', 'false'):
    return 'off'
  raise ValueError(f'{ENV}={v!r}: use auto (the default), 1 or 0')


def kernel_enabled(op: str) -> bool | str:
  """True if `op`'s CPU kernel may run here, else why not (for `ops.pick`).

  The CPU kernels are measured speed-ups over XLA, not the preferred path:
  running XLA without them is never a fallback in strict mode (the reasons
  are `elsewhere`).
  """
  ok = _kernel_enabled(op)
  return ok if ok is True else _registry.elsewhere(ok)


def _kernel_enabled(op: str) -> bool | str:
  if op not in KERNEL_OPS:
    raise ValueError(f'no CPU kernel for {op!r}; kernels: {KERNEL_OPS}')
  if _registry.backend() != 'cpu':
    return f'CPU kernels run on the CPU backend only ({_registry.backend()})'
  m = mode()
  if m == 'off':
    return f'{ENV}=0'
  if not kernels.built():
    return 'the CPU kernels did not build here (see the message above)'
  if m == 'on' or _registry.forced_choice(op) == 'cpu_kernel':
    return True
  verdict = calibration()[op]
  return True if verdict['use'] else (
      f"slower than XLA here (calibrated: kernel {verdict['kernel_us']} us "
      f"vs xla {verdict['xla_us']} us)")


def _median_us(fn, *args, repeats: int) -> float:
  return utils.time_fn(fn, *args, repeats=repeats) * 1e6


_STEPS = 20  # each timed call runs 20 steps (as a decode loop does)


def _loop(step):
  return jax.jit(lambda x, *a: jax.lax.fori_loop(
      0, _STEPS, lambda i, x: x + 1e-3 * step(x, *a), x))


def _moe_cases():
  """The main job's MoE layer (embed 128, 8 experts x 128, top-2) at two decode batches."""
  key = jax.random.key(0)
  e, d, f, k = 8, 128, 128, 2
  wg, wu, wd = (jax.random.normal(jax.random.fold_in(key, i), s) * 0.05
                for i, s in enumerate(((e, d, f), (e, d, f), (e, f, d))))
  for n in (64, 8):  # the main job's decode batch first: where it matters
    x = jax.random.normal(key, (n, d))
    idx = jnp.argsort(jax.random.uniform(key, (n, e)), axis=-1)[:, :k]
    w = jnp.full((n, k), 0.5)
    kern = _loop(lambda x, idx, w: kernels.moe_ffn(
        x, idx, w, wg, wu, wd, act='swiglu'))
    flat = lambda m: m.transpose(1, 0, 2).reshape(d, e * f)
    wgf, wuf, wdf = flat(wg), flat(wu), wd.reshape(e * f, d)

    def xla(x, idx, w):  # the sampler's `flat` layout: two flat matmuls
      comb = jnp.einsum('nk,nke->ne', w, jax.nn.one_hot(idx, e))
      h = jax.nn.silu(x @ wgf) * (x @ wuf)
      h = (h.reshape(n, e, f) * comb[:, :, None]).reshape(n, e * f)
      return h @ wdf
    yield n, (kern, _loop(xla)), (x, idx, w)


def _attention_cases():
  """Decode attention over a 128-slot cache (4 heads over 2 kv heads x 32)."""
  key = jax.random.key(1)
  kh, g, h, s = 2, 2, 32, 128
  for b in (64, 8):
    q = jax.random.normal(key, (b, 1, kh * g, h))
    knew = jax.random.normal(key, (b, 1, kh, h))
    ck = jax.random.normal(key, (b, kh, h, s))
    cv = jax.random.normal(key, (b, kh, s, h))
    mask = jnp.broadcast_to(jnp.arange(s) < s - 8, (b, 1, s))

    def kern(q, ck, cv):
      return kernels.cache_attention(q, knew, knew, ck, cv, mask, s - 9,
                                     scale=h ** -0.5)[0]

    def xla(q, ck, cv):
      ck = jax.lax.dynamic_update_slice_in_dim(
          ck, knew.transpose(0, 2, 3, 1), s - 9, axis=3)
      cv = jax.lax.dynamic_update_slice_in_dim(
          cv, knew.transpose(0, 2, 1, 3), s - 9, axis=2)
      qq = q.reshape(b, kh, g, h)
      logits = jnp.einsum('bkgh,bkhs->bkgs', qq, ck) * h ** -0.5
      p = jax.nn.softmax(jnp.where(mask[:, None], logits, -1e30), axis=-1)
      return jnp.einsum('bkgs,bksh->bkgh', p, cv).reshape(q.shape)
    yield b, (_loop(kern), _loop(xla)), (q, ck, cv)


def _argmax_cases():
  for b in (64, 8):
    x = jax.random.normal(jax.random.key(2), (b, 4096))

    def xla(x):
      top = jnp.max(x, axis=-1, keepdims=True)
      i = jnp.arange(x.shape[-1], dtype=jnp.int32)
      return jnp.min(jnp.where(x == top, i, x.shape[-1]), axis=-1)
    step = lambda f: jax.jit(lambda x: jax.lax.fori_loop(
        0, _STEPS, lambda i, c: c + f(x + c[0]).astype(jnp.float32).sum(),
        jnp.zeros((1,))))
    yield b, (step(kernels.argmax), step(xla)), (x,)


_CASES = {'moe_decode': _moe_cases, 'cache_attention': _attention_cases,
          'argmax': _argmax_cases}


def _measure() -> dict:
  out = {}
  for op, cases in _CASES.items():
    rows = []
    for size, (kern, xla), args in cases():
      # Interleaved, so that drift in the machine's speed hits both.
      k_us, x_us = [], []
      for _ in range(2):
        k_us.append(_median_us(kern, *args, repeats=3) / _STEPS)
        x_us.append(_median_us(xla, *args, repeats=3) / _STEPS)
      rows.append((size, min(k_us), min(x_us)))
      if rows[-1][1] >= MARGIN * rows[-1][2]:
        break  # slower at one size: off, whatever the others say
    use = all(k < MARGIN * x for _, k, x in rows)
    out[op] = dict(use=use, kernel_us=[round(k, 1) for _, k, _ in rows],
                   xla_us=[round(x, 1) for _, _, x in rows],
                   sizes=[s for s, _, _ in rows])
  return out


@functools.cache
def calibration() -> dict:
  """op -> {use, kernel_us, xla_us, sizes}: measured once per machine and build, cached."""
  path = kernels.cache_path(f'calibration_v{_CALIBRATION_VERSION}.json')
  path.parent.mkdir(parents=True, exist_ok=True)
  result = None
  if path.exists():
    try:
      result = json.loads(path.read_text())
      if set(result) != set(KERNEL_OPS):
        result = None
    except (OSError, ValueError):
      result = None
  fresh = result is None
  if fresh:
    t0 = time.perf_counter()
    # Ops ask while the sampler is being traced: in this thread every array
    # op would be staged into that trace (and the timings would time
    # nothing). JAX's trace state is per thread, so measure in a fresh one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      result = pool.submit(_measure).result()
    tmp = path.with_suffix(f'.tmp{os.getpid()}')
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, path)
    took = time.perf_counter() - t0
  parts = [f"{op} {'kernel' if r['use'] else 'xla'} "
           f"({'/'.join(map(str, r['kernel_us']))} vs "
           f"{'/'.join(map(str, r['xla_us']))} us a step at batch "
           f"{'/'.join(map(str, r['sizes']))})"
           for op, r in result.items()]
  msg = ('cascade_jax: CPU kernels, where faster than XLA on this machine: '
         + '; '.join(parts) +
         (f' [calibrated in {took:.1f}s' if fresh else ' [cached') +
         f', {path}; {ENV}=1 forces them, =0 turns them off]')
  print(msg, flush=True)
  logging.info(msg)
  return result

