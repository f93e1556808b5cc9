"""What the NeMo-Gym row tests share: the fixtures' folder, `experiments.verify` as a command, a refused row."""

import json
import os
import re
import subprocess
import sys

import pytest

from cascade_jax.domains import nemo_gym

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, 'tests', 'data', 'nemo_gym')


def verify(rows, out, *extra):
  """`python -m experiments.verify` in its own process (its absl flags are
  its own)."""
  return subprocess.run(
      [sys.executable, '-m', 'experiments.verify', f'--rows={rows}',
       f'--out={out}', '--test_seconds=1', '--workers=2', *extra],
      cwd=ROOT, capture_output=True, text=True, timeout=600)


def assert_refused(tmp_path, row, says):
  """A file of the one row is refused, naming its file, line 1 and `says`."""
  path = tmp_path / 'rows.jsonl'
  path.write_text(json.dumps(row) + '\n')
  with pytest.raises(nemo_gym.RowError, match=f'{path}:1: {re.escape(says)}'):
    nemo_gym.read_rows(str(path))


def episodes_through_sampler(recs, *, text_repeats: int, max_tokens: int):
  """`recs` played by `rollout.run_episodes` with their domain's
  environment, on a random tiny model whose tokenizer is trained on their
  messages (repeated `text_repeats` times): (episodes, environments made)."""
  # pylint: disable=g-import-not-at-top
  import jax
  from flax import nnx
  from cascade_jax import data, model, rollout
  # pylint: enable=g-import-not-at-top
  tok = data.train_tokenizer(
      [m['content'] for r in recs for m in r['messages']] * text_repeats, 300)
  m = model.Transformer(model.tiny(vocab_size=tok.vocab_size),
                        rngs=nnx.Rngs(0))
  ec = rollout.EpisodeConfig(max_turns=2, max_new_tokens=8,
                             max_observation_tokens=32, max_tokens=max_tokens)
  made = []

  def make(record, sandbox):
    made.append(rollout.make_env(record, sandbox))
    return made[-1]

  eps = rollout.run_episodes(m, tok, recs, cfg=ec,
                             sample=rollout.SampleConfig(temperature=1.0),
                             key=jax.random.key(0), make=make)
  return eps, made
