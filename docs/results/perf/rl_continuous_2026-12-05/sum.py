"""Summed phase seconds of RL rerun directories' rl_metrics.jsonl (the rule's metric)."""
import glob
import json
import os
import sys

print('| run | steps | sample_s | score_s | train_s | step_s |')
print('|---|---:|---:|---:|---:|---:|')
for d in sys.argv[1:]:
  f = (glob.glob(os.path.join(d, '**', 'rl_metrics.jsonl'), recursive=True)
       or [None])[0]
  if f is None:
    print(f'| {d} | (no rl_metrics.jsonl) | | | | |')
    continue
  rows = [json.loads(line) for line in open(f)]
  tot = lambda k, rows=rows: sum(r.get(k, 0.0) for r in rows)
  print(f'| {os.path.basename(d)} | {len(rows)} | {tot("sample_s"):.1f} | '
        f'{tot("score_s"):.1f} | {tot("train_s"):.1f} | {tot("step_s"):.1f} |')
