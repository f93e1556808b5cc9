"""The absl launchers run from the command line with configs and overrides."""

import json
import os
import platform
import subprocess
import sys

import pytest

import _run_helpers  # pylint: disable=g-import-not-at-top

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
  return subprocess.run([sys.executable, '-m', *args], cwd=_ROOT,
                        env=_run_helpers.child_env(),
                        capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # ~13 s, a benchmark: CI runs it
def test_bench_moe_quick_writes_a_table_and_results(tmp_path):
  r = _run('benchmarks.moe', '--config=benchmarks/configs/moe.py:quick',
           '--config.num_experts=4', f'--workdir={tmp_path}')
  assert r.returncode == 0, r.stderr
  assert 'best path:' in r.stdout
  rows = json.load(open(tmp_path / 'results.json'))
  assert [row['path'] for row in rows][1:4] == ['capacity', 'ragged', 'dense']
  assert all(row['seconds'] > 0 for row in rows[:4])
  assert json.load(open(tmp_path / 'config.json'))['num_experts'] == 4
  _assert_provenance(tmp_path, 'benchmarks.moe')


def _assert_provenance(workdir, module):
  """A benchmark's results come with the commit, command and machine."""
  prov = json.load(open(workdir / 'provenance.json'))
  assert len(prov['commit']) == 40 or prov['commit'] == 'unknown', prov
  assert module.replace('.', '/') in prov['command'], prov
  assert prov['machine'].split(', ')[-1] in ('avx512', 'avx2', 'sse',
                                             platform.machine()), prov


def test_unknown_config_key_is_refused():
  r = _run('benchmarks.moe', '--config=benchmarks/configs/moe.py:quick',
           '--config.num_expert=4')
  assert r.returncode != 0
  assert 'num_expert' in r.stderr


def test_unknown_config_argument_is_refused():
  r = _run('benchmarks.moe', '--config=benchmarks/configs/moe.py:huge')
  assert r.returncode != 0
  assert "unknown argument 'huge'" in r.stderr


@pytest.mark.slow  # ~17 s, a benchmark: CI runs it
def test_bench_rollout_quick_prints_both_tables(tmp_path):
  # The sampler against transformers (same tokens), then the MoE decode
  # layer; with --workdir (as its sweep launches it) both as results.json.
  r = _run('benchmarks.rollout',
           '--config=benchmarks/configs/rollout.py:quick', '--config.num_experts=4',
           f'--workdir={tmp_path}')
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  row = lines[lines.index(next(x for x in lines if x.startswith('batch'))) + 2]
  assert row.split()[0] == '2' and float(row.split()[4]) == 1.0, r.stdout
  assert 'MoE layer, one decode step (us)' in r.stdout
  res = json.load(open(tmp_path / 'results.json'))
  assert res['sampler'][0]['batch'] == 2 and res['sampler'][0]['same_tokens'] == 1
  assert res['moe_decode_layer_us'][0]['xla'] > 0
  assert json.load(open(tmp_path / 'config.json'))['num_experts'] == 4
  _assert_provenance(tmp_path, 'benchmarks.rollout')


@pytest.mark.slow  # ~50 s: CI runs it
def test_bench_accel_quick_runs_every_part_on_cpu(tmp_path):
  # The H200 benchmark's code at CPU sizes: every row, and the ops it ran.
  r = _run('benchmarks.accel', '--config=benchmarks/configs/accel.py:quick',
           f'--workdir={tmp_path}')
  assert r.returncode == 0, r.stderr
  res = json.load(open(tmp_path / 'results.json'))
  metrics = [row['metric'] for row in res['rows']]
  assert any(m.startswith('MoE layer fwd+bwd, ragged') for m in metrics)
  assert any(m.startswith('train step MFU') for m in metrics)
  assert sum(m.startswith('decode batch 2') for m in metrics) == 2
  assert any(m.startswith('weight sync') for m in metrics)
  gaps = [r for r in res['rows'] if r['metric'].startswith('learner vs sampler')]
  assert len(gaps) == 2 and all(0 <= r['value'] < 1e-5 for r in gaps)  # fp32
  assert res['failed'] == []
  assert all(row['value'] > 0 for row in res['rows'] if row not in gaps)
  assert res['ops']['grouped_matmul'] == ['xla (cpu, float32)']
  assert 'metric' in r.stdout and 'ops picked' in r.stdout


@pytest.fixture(scope='module')
def quick_cascade(tmp_path_factory):
  """SFT, the reward model and the judge at the quick size (one device)."""
  d = tmp_path_factory.mktemp('quick_cascade')
  r = _run('experiments.cascade', '--config=configs/cascade.py:quick',
           '--config.order=sft,rm,judge', '--config.mesh.data=1',
           f'--workdir={d}')
  assert r.returncode == 0, r.stderr
  return d


@pytest.mark.slow  # ~2 min with the cascade: CI runs it
def test_mopd_vs_grpo_writes_curves_steps_and_provenance(quick_cascade,
                                                         tmp_path):
  r = _run('experiments.mopd_vs_grpo', '--config=configs/mopd_vs_grpo.py:quick',
           f'--config.init_from={quick_cascade}/sft',
           f'--config.teacher={quick_cascade}/sft', f'--workdir={tmp_path}')
  assert r.returncode == 0, r.stderr
  res = json.load(open(tmp_path / 'results.json'))
  assert res['seeds'] == [0] and set(res['steps_to_teacher']) == {'grpo',
                                                                  'mopd'}
  for arm in ('grpo', 'mopd'):
    curve = res['runs']['0'][arm]
    assert curve['steps'] == [0, 1, 2] and len(curve['ses']) == 3
    # Both arms start from the same checkpoint, scored with the same key.
    assert curve['scores'][0] == res['runs']['0']['grpo']['scores'][0]
  assert res['meta']['commit'] and res['meta']['wall_s'] > 0
  assert os.path.getsize(tmp_path / 'curves.png') > 0
  assert 'steps to teacher' in r.stdout
  r = _run('experiments.mopd_vs_grpo', '--config=configs/mopd_vs_grpo.py:quick',
           f'--config.init_from={tmp_path}/nope',
           f'--config.teacher={quick_cascade}/sft', f'--workdir={tmp_path}/x')
  assert r.returncode != 0 and 'init_from' in r.stderr


@pytest.mark.slow
def test_judge_agreement_ranks_pairs_beside_bradley_terry(quick_cascade,
                                                          tmp_path):
  r = _run('experiments.judge_agreement', f'--run={quick_cascade}', '--n=16',
           f'--workdir={tmp_path}')
  assert r.returncode == 0, r.stderr
  res = json.load(open(tmp_path / 'agreement.json'))
  assert res['pairs']['n'] == 16
  for k in ('bradley_terry', 'judge', 'judge_greedy_verdicts'):
    assert 0.0 <= res['pairs'][k] <= 1.0
  assert res['samples']['of_prompts'] == 16
  assert 'Bradley-Terry' in r.stdout
  # A run without a judge (the default main job): the Bradley-Terry model
  # alone, on the same pairs and samples.
  r = _run('experiments.judge_agreement', f'--run={quick_cascade}', '--n=16',
           '--judge=', f'--workdir={tmp_path}/bt')
  assert r.returncode == 0, r.stderr
  bt = json.load(open(tmp_path / 'bt' / 'agreement.json'))
  for k in ('pairs', 'samples'):
    assert bt[k] == {c: res[k][c] for c in bt[k]} and 'judge' not in bt[k]
  header = next(x for x in r.stdout.splitlines() if 'pairs of' in x)
  assert 'Bradley-Terry' in header and 'judge' not in header


def test_the_claims_tables_are_written_from_the_results():
  # Every row of the claims tables (docs/claims/README.md, README.md) is
  # what the committed result files say (python -m experiments.claims
  # --write), every rule came before its results or says it did not, and
  # a claim without files is one whose rule is registered ahead of its
  # runs (not post hoc).
  from experiments.claims import rules as rules_lib  # pylint: disable=g-import-not-at-top
  r = _run('experiments.claims', '--check')
  assert r.returncode == 0, r.stderr
  with open(os.path.join(_ROOT, 'docs', 'claims', 'README.md')) as f:
    table = f.read()
  for cid, rule in rules_lib.load_rules().items():
    row = next(l for l in table.splitlines() if f']({cid}.json)' in l)
    if 'not measured' in row:
      assert 'post_hoc' not in rule, cid
    assert ('(post hoc' in row) == bool(rule.get('post_hoc')), cid


def test_steps_to_the_teacher_on_known_curves():
  # experiments.curves defines no flags: importing a launcher here would
  # define its flags beside other tests' in this process.
  from experiments import curves as mvg  # pylint: disable=g-import-not-at-top
  steps = [0, 2, 4, 6, 8]
  rising = [0.2, 0.3, 0.45, 0.6, 0.55]
  assert mvg.steps_to_reach(steps, rising, 0.45) == 4      # reached exactly
  assert mvg.steps_to_reach(steps, rising, 0.5) == 6       # first at or above
  assert mvg.steps_to_reach(steps, rising, 0.61) is None   # never
  # Half the gap 0.2 -> 0.6 is 0.4 (step 4); 90 % is 0.56 (step 6).
  assert mvg.steps_to_close(steps, rising, 0.6, 0.5) == 4
  assert mvg.steps_to_close(steps, rising, 0.6, 0.9) == 6
  # A start above the target closes its (negative) gap at once.
  assert mvg.steps_to_close(steps, [0.7, 0.1, 0.1, 0.1, 0.1], 0.6, 0.5) == 0
  s = mvg.summarize([4, None, 6], horizon=10)
  assert s == dict(per_seed=[4, None, 6], reached=2, seeds=3, mean=5.0,
                   min=4, max=6, mean_censored=20 / 3)
  none = mvg.summarize([None, None], horizon=8)
  assert none['reached'] == 0 and none['mean'] is None
  assert none['mean_censored'] == 8.0


def test_decoupled_model_adds_the_plans_phases(tmp_path):
  # The pod model of a decoupled GRPO step from the committed plan rows:
  # the synchronous step is the sum of its phases, each split overlaps
  # them, and no split beats running both phases on every chip when
  # generation alone takes most of the step.
  out = tmp_path / 'model.json'
  subprocess.run([sys.executable, "-m", "experiments.decoupled_model",
                  f"--out={out}"], cwd=_ROOT, check=True, capture_output=True,
                 timeout=120)
  m = json.loads(out.read_text())
  p = m['phases']
  assert m['sync_step_s'] == pytest.approx(
      p['generation_s'] + p['update_s'] + p['sync_s'])
  assert p['rows'] == 2048 and p['micro_batches'] == 64
  for s in m['splits']:
    assert s['learner_chips'] + s['sampler_chips'] == p['chips']
    assert s['step_s'] == pytest.approx(
        max(s['generation_s'], s['update_s']) + p['sync_s'])
  assert p['generation_s'] > p['update_s'] and m['best']['speedup'] < 1
  # The splits the code runs on a pod (a sampler process beside each
  # learner process): whole chips a host of v5p-64's 8 hosts of 4.
  assert [(s['learner_chips'], s['sampler_chips']) for s in m['splits']
          if s['runs_on_a_pod']] == [(8, 24), (16, 16), (24, 8)]
  # Another sampler variant of rows a chip: its decode rounds, the same
  # prefill work per row (the learner plan's 256-row prefill, 8 of them).
  plan = [dict(r, variant='16 rows', tokens=512) for r in json.load(open(
      os.path.join(_ROOT, 'docs/results/plan/decode_layer_arrays_2026-12-05/plan/'
                   'results.json'))) if r['mesh'] == 'v5p-64 (32)']
  (tmp_path / 'rows.json').write_text(json.dumps(plan))
  subprocess.run([sys.executable, '-m', 'experiments.decoupled_model',
                  f'--sampler={tmp_path / "rows.json"}', '--variant=16 rows',
                  f'--out={out}'], cwd=_ROOT, check=True, capture_output=True,
                 timeout=120)
  v = json.loads(out.read_text())['phases']
  assert (v['rounds'], v['prefills'], v['decode_rows']) == (4, 8, 512)
  assert v['generation_s'] == pytest.approx(
      (8 * v['prefill_ms'] + 4 * 8192 * v['decode_ms']) / 1e3)
  # The default: the plan's 64 rows a chip (2,048 on v5p-64), one round,
  # decoding with an index a row (docs/results/plan/row_index_2026-12-07).
  assert (p['rounds'], p['prefills'], p['decode_rows']) == (1, 8, 2048)
  with pytest.raises(subprocess.CalledProcessError) as e:
    subprocess.run([sys.executable, '-m', 'experiments.decoupled_model',
                    '--variant=3 rows'], cwd=_ROOT, check=True,
                   capture_output=True, text=True, timeout=120)
  assert "no decode row on v5p-64 (32) at variant '3 rows'" in e.value.stderr


_CACHED_PROGRAM = r'''
import sys
import jax
import jax.numpy as jnp
from cascade_jax import utils
hits = []
jax.monitoring.register_event_listener(
    lambda e, **kw: hits.append(e) if e.endswith('cache_hits') else None)
assert utils.enable_compilation_cache() == sys.argv[1]
print(float(jax.jit(lambda x: jnp.tanh(x) * 3 + 1)(jnp.ones(5))[0]),
      len(hits))
'''


def test_the_launchers_compilation_cache_keeps_quick_programs(tmp_path):
  # A program that compiles in milliseconds (under JAX's default 1 s
  # threshold) is kept, and a second process loads it instead of compiling.
  env = _run_helpers.child_env(CASCADE_JAX_XLA_CACHE=str(tmp_path / 'xla'))
  out = [subprocess.run([sys.executable, '-c', _CACHED_PROGRAM,
                         str(tmp_path / 'xla')], cwd=_ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
         for _ in range(2)]
  assert [r.returncode for r in out] == [0, 0], out[-1].stderr
  (v1, hits1), (v2, hits2) = (r.stdout.split() for r in out)
  assert v1 == v2
  # The second loads the function and the eager ops before it (ones, ...).
  assert hits1 == '0' and int(hits2) >= 1, (hits1, hits2)
  assert os.listdir(tmp_path / 'xla')
