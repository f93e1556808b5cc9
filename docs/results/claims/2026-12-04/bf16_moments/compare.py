"""The registered comparison (README): bf16 against fp32 Adam moments, the main job's SFT.

  python docs/results/claims/2026-12-04/bf16_moments/compare.py /tmp/bm_float32 /tmp/bm_bfloat16
"""
import json
import sys

import numpy as np


def load(run):
  stage = json.load(open(f'{run}/sft/stage.json'))
  logs = [json.loads(l) for l in open(f'{run}/sft/sft_metrics.jsonl')]
  loss = [r['loss'] for r in logs if r.get('step') in (325, 350, 375, 400)
          and 'loss' in r]
  assert len(loss) == 4, loss
  return stage['scores'], float(np.mean(loss))


def main(fp32_run, bf16_run):
  (s32, l32), (s16, l16) = load(fp32_run), load(bf16_run)
  diffs = []
  print(f"{'domain':24s} {'fp32':>7s} {'bf16':>7s} {'diff':>7s}")
  for dom in sorted(s32):
    a, b = s32[dom]['prompt_pass'], s16[dom]['prompt_pass']
    assert a.keys() == b.keys(), dom
    d = [b[k] - a[k] for k in a]
    diffs += d
    print(f"{dom:24s} {s32[dom]['pass_rate']:7.3f} {s16[dom]['pass_rate']:7.3f} "
          f'{np.mean(d):+7.3f}')
  d = np.asarray(diffs)
  mean, se = d.mean(), d.std(ddof=1) / np.sqrt(len(d))
  ratio = l16 / l32
  print(f'(a) pass@1 over {len(d)} prompts, bf16 - fp32: {mean:+.4f} '
        f'(paired SE {se:.4f}; -2 SE = {-2 * se:+.4f})')
  print(f'(b) loss at steps 325-400: fp32 {l32:.4f}, bf16 {l16:.4f}, '
        f'ratio {ratio:.4f} (limit 1.02)')
  ok = mean > -2 * se and ratio <= 1.02
  print('verdict:', 'bf16 moments no worse shown at this scale' if ok else
        'bf16 moments worse at this scale', '(one seed, one stage)')


if __name__ == '__main__':
  main(*sys.argv[1:3])
