"""Summed phase seconds and decode counts of RL rerun directories' rl_metrics.jsonl (the rule's metric: sample_s)."""
import glob
import json
import os
import sys

print('| run | steps | sample_s | score_s | train_s | step_s | decode steps '
      '| tokens a step | reward mean |')
print('|---|---:|---:|---:|---:|---:|---:|---:|---:|')
for d in sys.argv[1:]:
  f = (glob.glob(os.path.join(d, '**', 'rl_metrics.jsonl'), recursive=True)
       or [None])[0]
  if f is None:
    print(f'| {d} | (no rl_metrics.jsonl) |' + ' |' * 7)
    continue
  rows = [json.loads(line) for line in open(f)]
  tot = lambda k, rows=rows: sum(r.get(k, 0.0) for r in rows)
  steps, tokens = tot('episode_decode_steps'), sum(
      r.get('episode_decode_steps', 0) * r.get('episode_tokens_per_step', 0)
      for r in rows)
  print(f'| {os.path.basename(d)} | {len(rows)} | {tot("sample_s"):.1f} | '
        f'{tot("score_s"):.1f} | {tot("train_s"):.1f} | {tot("step_s"):.1f} | '
        f'{steps:.0f} | {tokens / max(steps, 1):.1f} | '
        f'{tot("reward_mean") / len(rows):.3f} |')
