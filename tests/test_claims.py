"""The claims' rules as data: every verdict function on synthetic results, and the check that a rule was committed before its results."""

import json
import os
import subprocess

import pytest

from experiments.claims import history
from experiments.claims import measures
from experiments.claims import rules as rules_lib
from experiments.claims import verdicts

from _claims_helpers import measure as _measure
from _claims_helpers import repo_deciders as _deciders
from _claims_helpers import rule_of as _rule_of
from _claims_helpers import verdict as _verdict


def _c(change, se=0.01):
  return dict(change=change, se=se)


def test_verdict_all_up_counts_and_names_the_misses():
  rule = dict(threshold=2.0)
  assert verdicts.verdict_all_up(rule, dict(changes=[_c(0.03), _c(0.05)])) \
      == 'holds'
  # 0.02 is exactly 2 SE: not beyond.
  assert verdicts.verdict_all_up(rule, dict(changes=[_c(0.03), _c(0.02),
                                                   _c(-0.1)])) == '1/3'


def test_verdict_band_then_up():
  rule = dict(threshold=2.0, seeds=3, band=[0.3, 0.6])
  up3 = [_c(0.05)] * 3
  assert verdicts.verdict_band_then_up(rule, dict(start=0.5, changes=up3)) \
      == 'holds'
  assert verdicts.verdict_band_then_up(rule, dict(start=0.7, changes=up3)) \
      == 'partly'
  assert verdicts.verdict_band_then_up(
      rule, dict(start=0.5, changes=[_c(0.05), _c(0.0), _c(0.05)])) == 'partly'
  assert verdicts.verdict_band_then_up(
      rule, dict(start=0.1, changes=[_c(0.0)] * 3)) == 'no'
  assert verdicts.verdict_band_then_up(
      rule, dict(start=0.5, changes=up3[:2])) == 'open (2 of 3 seeds)'


def test_verdict_fewer_steps_to_teacher_is_the_rule_of_e7a9e0d():
  arm = lambda reached, mean: dict(reached=reached, mean=mean)
  v = lambda m, g: verdicts.verdict_fewer_steps_to_teacher(
      {}, dict(mopd=m, grpo=g))
  # The committed results: MOPD 2 of 3 seeds (mean 9), GRPO 3 of 3 (13.3).
  assert v(arm(2, 9.0), arm(3, 13.3)) == 'no'
  assert v(arm(3, 9.0), arm(3, 13.3)) == 'holds'
  assert v(arm(3, 14.0), arm(3, 13.3)) == 'no'
  assert v(arm(1, 30.0), arm(0, None)) == 'holds'
  assert v(arm(0, None), arm(0, None)) == 'no'


def test_verdict_up_in_seeds():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2)
  v = lambda cs: verdicts.verdict_up_in_seeds(rule, dict(changes=cs))
  assert v([_c(0.05), _c(0.03), _c(0.0)]) == 'holds'
  assert v([_c(0.05), _c(0.02), _c(0.0)]) == 'partly (1 of 3 seeds)'
  assert v([_c(-0.05)] * 3) == 'no'
  assert v([_c(0.05)]) == 'open (1 of 3 seeds)'


def test_verdict_reported():
  assert verdicts.verdict_reported({}, dict(n=256)) == 'built'
  assert verdicts.verdict_reported({}, dict(n=0)) == 'open'


def test_verdict_mean_ahead():
  rule = dict(arm='generative_judge', other='bradley_terry')
  assert verdicts.verdict_mean_ahead(rule, dict(means=dict(
      generative_judge=0.017, bradley_terry=0.25))) == \
      'no: bradley_terry ahead'
  assert verdicts.verdict_mean_ahead(rule, dict(means=dict(
      generative_judge=0.3, bradley_terry=0.25))) == \
      'holds: generative_judge ahead'
  assert verdicts.verdict_mean_ahead(rule, dict(means=dict(
      bradley_terry=0.25))) == 'open'


def test_verdict_hurts_then_recovers():
  rule = dict(threshold=2.0)
  hurt = [_c(-0.07), _c(-0.01)]
  assert verdicts.verdict_hurts_then_recovers(rule, dict(
      changes=hurt, start=0.39, recovered=0.64)) == 'holds'
  assert verdicts.verdict_hurts_then_recovers(rule, dict(
      changes=[_c(-0.01)] * 2, start=0.39, recovered=0.64)) == \
      'RLHF recovers; IF-RL does not hurt here'
  assert verdicts.verdict_hurts_then_recovers(rule, dict(
      changes=hurt, start=0.39, recovered=0.30)) == 'no'


def test_verdict_hurts_then_recovers_in_seeds():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2)
  s = lambda hurt, back: dict(hurt=_c(hurt), recovered=_c(back))
  v = lambda *seeds: verdicts.verdict_hurts_then_recovers_in_seeds(
      rule, dict(seeds=list(seeds)))
  assert v(s(-0.07, 0.2), s(-0.05, 0.1), s(0.0, 0.0)) == 'holds'
  # -0.02 is exactly 2 SE: not beyond; one seed of three is not two.
  # The words rule 35 was decided with (2+ of 3 seeds: the part named
  # first holds, the other does not).
  assert v(s(-0.07, 0.2), s(-0.02, 0.1), s(0.0, 0.1)) == \
      'partly: RLHF above SFT; IF-RL does not hurt in 2 of 3 seeds'
  assert v(s(-0.07, 0.0), s(-0.05, 0.1), s(0.0, 0.0)) == \
      'partly: IF-RL hurts; RLHF not above SFT in 2 of 3 seeds'
  assert v(s(0.0, 0.0), s(-0.05, 0.0), s(0.1, 0.1)) == 'no'
  assert v(s(-0.07, 0.2), s(-0.05, 0.1)) == 'open (2 of 3 seeds)'


def test_verdict_best_mean():
  rule = dict(name='KL')
  assert verdicts.verdict_best_mean(rule, dict(means={'0.03': 0.28, '0.1': 0.25})
                                  ) == 'KL 0.03 better here'
  assert verdicts.verdict_best_mean(rule, dict(means={'0.03': 0.2, '0.1': 0.25})
                                  ) == 'KL 0.1 better here'
  assert verdicts.verdict_best_mean(rule, dict(means={'0.1': 0.25})).startswith(
      'open')


def test_verdict_forgets_little():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2)
  fine = [_c(0.0)] * 3
  m = lambda final, stages, seeds=3: dict(seeds=seeds, final_vs_sft=final,
                                          stage_drops=stages)
  assert verdicts.verdict_forgets_little(
      rule, m({'math': fine}, {'rlhf math': fine})) == 'holds'
  # One seed of three below: not enough.
  one = [_c(-0.09), _c(0.0), _c(0.0)]
  assert verdicts.verdict_forgets_little(
      rule, m({'math': one}, {'rlhf math': one})) == 'holds'
  two = [_c(-0.09), _c(-0.05), _c(0.0)]
  assert verdicts.verdict_forgets_little(
      rule, m({'math': fine}, {'rlhf math': two})) == \
      'partly: rlhf math dropped, recovered by the end'
  assert verdicts.verdict_forgets_little(
      rule, m({'math': two, 'code': fine}, {'rlhf math': two})) == \
      'no: below SFT at the end in math'
  assert verdicts.verdict_forgets_little(
      rule, m({'math': fine[:1]}, {}, seeds=1)) == 'open (1 of 3 seeds)'


def test_verdict_recovers():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2, domains=['math', 'code'])
  up, flat = [_c(0.09)] * 3, [_c(0.0)] * 3
  m = lambda math, code: dict(domains=dict(math=math, code=code))
  assert verdicts.verdict_recovers(
      rule, m(dict(mopd=up, grpo=flat), dict(mopd=up, grpo=up))) == 'holds'
  # Up in both, but GRPO's mean higher in code: partly, and it says so.
  assert verdicts.verdict_recovers(
      rule, m(dict(mopd=up, grpo=flat),
              dict(mopd=up, grpo=[_c(0.2)] * 3))) == \
      'partly: MOPD recovers math, code; GRPO ahead in code'
  two = [_c(0.09), _c(0.09), _c(0.0)]
  assert verdicts.verdict_recovers(
      rule, m(dict(mopd=two, grpo=flat), dict(mopd=flat, grpo=up))) == \
      'partly: MOPD recovers math; GRPO ahead in code'
  one = [_c(0.09), _c(0.0), _c(0.0)]
  assert verdicts.verdict_recovers(
      rule, m(dict(mopd=one, grpo=flat), dict(mopd=flat, grpo=flat))) == 'no'
  assert verdicts.verdict_recovers(
      rule, m(dict(mopd=up[:2], grpo=flat), dict(mopd=up, grpo=up))
  ) == 'open (2 of 3 seeds)'


def test_verdict_mixing_forgets_less():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2, domains=['math', 'code'],
              own='long_context')
  lo, hi = [_c(-0.08)] * 3, [_c(-0.01)] * 3
  lifted, flat = [_c(0.1)] * 3, [_c(0.0)] * 3
  m = lambda math, code, own: dict(domains=dict(
      math=dict(zip(('alone', 'mixed'), math)),
      code=dict(zip(('alone', 'mixed'), code))), own=dict(mixed=own))
  assert verdicts.verdict_mixing_forgets_less(
      rule, m((lo, hi), (lo, hi), lifted)) == 'holds'
  assert verdicts.verdict_mixing_forgets_less(
      rule, m((lo, hi), (lo, hi), flat)) == \
      'partly: math, code kept, long_context not lifted'
  # Above in two seeds of three in code: not every seed.
  mixed_code = [_c(-0.01), _c(-0.01), _c(-0.09)]
  assert verdicts.verdict_mixing_forgets_less(
      rule, m((lo, hi), (lo, mixed_code), lifted)) == 'partly: math kept'
  assert verdicts.verdict_mixing_forgets_less(
      rule, m((hi, lo), (hi, lo), lifted)) == 'no'
  assert verdicts.verdict_mixing_forgets_less(
      rule, m((lo[:2], hi[:2]), (lo, hi), lifted)) == 'open (2 of 3 seeds)'


def test_verdict_order_ahead():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2, default='default',
              arms=dict(default='', cascade1='', code_first=''))
  d = lambda *xs: [dict(diff=x, se=0.01) for x in xs]
  m = lambda a, b: dict(diffs=dict(cascade1=a, code_first=b))
  ahead, behind, flat = d(0.05, 0.03, 0.0), d(-0.05, -0.03, 0.0), d(0, 0, 0)
  assert verdicts.verdict_order_ahead(rule, m(ahead, ahead)) == 'holds'
  assert verdicts.verdict_order_ahead(rule, m(ahead, flat)) == \
      'partly: ahead of cascade1'
  # Behind one order outweighs ahead of the other.
  assert verdicts.verdict_order_ahead(rule, m(ahead, behind)) == \
      'no: code_first ahead of the default'
  assert verdicts.verdict_order_ahead(rule, m(flat, flat)) == \
      'not shown at this scale'
  # Ahead in one seed only, or within 2 SE (0.015 < 2 x 0.01): not enough.
  assert verdicts.verdict_order_ahead(
      rule, m(d(0.05, 0.015, 0.0), ahead)) == 'partly: ahead of code_first'
  assert verdicts.verdict_order_ahead(rule, m(ahead[:2], ahead)) == \
      'open (2 of 3 seeds)'
  assert verdicts.verdict_order_ahead(
      rule, dict(void='seed 1: sft differs', diffs={})).startswith('void')


def test_verdict_both_parts_in_seeds():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2)
  s = lambda *ab: dict(seeds=[dict(a=a, b=b) for a, b in ab])
  yes, no = (True, True), (True, False)
  assert verdicts.verdict_both_parts_in_seeds(rule, s(yes, yes, no)) == \
      '0.03 becomes the default'
  assert verdicts.verdict_both_parts_in_seeds(rule, s(yes, no, (False, True))) \
      == '0.1 stays (both parts in 1 of 3 seeds)'
  assert verdicts.verdict_both_parts_in_seeds(rule, s(yes, yes)) == \
      'open (2 of 3 seeds)'
  assert verdicts.verdict_both_parts_in_seeds(
      rule, dict(seeds=[], void='seed 0: x')) == 'void (seed 0: x)'


def test_verdict_paired_ahead():
  rule = dict(threshold=2.0, seeds=5, min_gap_se=6.0)
  m = lambda xs, gap=8.0: dict(per_seed=xs, gap_se=gap)
  assert verdicts.verdict_paired_ahead(
      rule, m([0.03, 0.04, 0.05, 0.03, 0.04])) == 'holds'
  assert verdicts.verdict_paired_ahead(
      rule, m([-0.03, -0.04, -0.05, -0.03, -0.04])) == 'no: GRPO ahead'
  # Mean +0.01 with an SE of about 0.016 over seeds: within 2 SE.
  assert verdicts.verdict_paired_ahead(
      rule, m([0.05, -0.03, 0.04, -0.04, 0.03])) == 'not shown at this scale'
  assert verdicts.verdict_paired_ahead(
      rule, m([0.03] * 4 + [0.04], gap=4.0)).startswith('void (the teacher 4.0')
  assert verdicts.verdict_paired_ahead(rule, m([0.03] * 3)) == \
      'open (3 of 5 seeds)'


def test_verdict_own_up_in_seeds():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2)
  up, flat = _c(0.1), _c(0.0)
  m = lambda a, b: dict(pairs={'if_rl IF': a, 'rlhf pref': b})
  assert verdicts.verdict_own_up_in_seeds(rule, m([up, up, flat],
                                                [up, flat, up])) == 'holds'
  assert verdicts.verdict_own_up_in_seeds(rule, m([up, up, flat],
                                                [up, flat, flat])) == \
      '1/2 (misses: rlhf pref)'
  assert verdicts.verdict_own_up_in_seeds(rule, m([up, up], [up, up, up])) == \
      'open (2 of 3 seeds)'


def test_verdict_setting_chosen():
  rule = dict(threshold=2.0, seeds=3, in_seeds=2, default='default',
              arms=['default', 'lr', 'kl'])
  r = lambda pref, math=0.0, se=0.01: dict(pref=pref, pref_se=se, math=math,
                                           math_se=se)
  flat, up, big = [r(0.0)] * 3, [r(0.05)] * 3, [r(0.08)] * 3
  v = lambda **arms: verdicts.verdict_setting_chosen(rule, dict(arms=arms))
  assert v(default=flat, lr=up, kl=big) == 'kl becomes the setting'
  # Up in only 1 of 3 seeds does not qualify, whatever its mean.
  assert v(default=flat, lr=up, kl=[r(0.3), r(0.0), r(0.0)]) == \
      'lr becomes the setting'
  # Math down beyond 2 x its SE against the default's disqualifies.
  assert v(default=flat, lr=up, kl=[r(0.08, math=-0.05)] * 3) == \
      'lr becomes the setting'
  assert v(default=flat, lr=[r(0.05, math=-0.019)] * 3, kl=flat) == \
      'lr becomes the setting'
  # Not above the default's mean: the default stays.
  assert v(default=big, lr=up, kl=up) == 'holds at the default'
  assert v(default=flat, lr=flat, kl=[r(-0.05)] * 3) == \
      'not made to work by lr, KL or steps at this scale'
  assert v(default=flat, lr=up, kl=up[:2]) == \
      'open (default 3 of 3, lr 3 of 3, kl 2 of 3 seeds)'


def test_every_verdict_function_has_a_test_here():
  # Here or beside the hybrid's measures (tests/test_hybrid_measures.py).
  tested = ''
  for name in (__file__, os.path.join(os.path.dirname(__file__),
                                      'test_hybrid_measures.py')):
    with open(name) as f:
      tested += f.read()
  for name in verdicts.VERDICTS:
    assert f'test_verdict_{name}' in tested, name


def test_the_repositorys_rules_load_and_name_known_verdicts():
  rules = rules_lib.load_rules()
  assert len(rules) >= 8
  assert rules['3_mopd_vs_grpo']['rule']['verdict'] == 'fewer_steps_to_teacher'
  # Every rule from 8 on is registered before its runs (13 says post hoc
  # why).
  registered = [c for c in rules if 8 <= int(c.split('_')[0]) and
                c != '13_rlhf_kl_main']
  assert len(registered) == 28
  for cid in registered:
    assert 'post_hoc' not in rules[cid], cid
  # In the order of their numbers (9 before 10).
  assert list(rules)[-28:] == ['9_if_rl_reward', '10_mopd_recovers',
                               '11_long_context_mix', '12_stage_order',
                               '13_rlhf_kl_main', '14_mopd_gap',
                               '15_own_domain_hybrid', '16_forgetting_hybrid',
                               '17_hybrid_rlhf', '18_math_hybrid',
                               '19_if_rl_reward_hybrid', '20_recover_hybrid',
                               '21_sft_mix_hybrid', '22_lc_mix_hybrid',
                               '23_mopd_gap_hybrid', '24_lc_lr_hybrid',
                               '25_lc_lr', '26_rlhf_reward_hybrid',
                               '27_judge_hybrid', '28_if_hurts_hybrid',
                               '29_stage_order_hybrid',
                               '30_rlhf_kl_main_hybrid',
                               '31_settings_hybrid', '32_mopd_hybrid',
                               '33_sft_pref_hybrid', '34_own_domain_seeds',
                               '35_if_hurts_seeds', '36_forgetting_seeds']


# ----------------------------------------------------------- history

def _git(root, *args):
  subprocess.run(['git', '-C', str(root), *args], check=True,
                 capture_output=True)


def _commit(root, msg):
  _git(root, 'add', '-A')
  _git(root, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q',
       '-m', msg)


def _write(root, rel, doc):
  path = root / rel
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(doc))


def _rule(threshold=2.0, results='res/*.json', **extra):
  return dict(claim='c', results=results, command='run it',
              measure='main_job',
              rule=dict(verdict='all_up', metric='m', comparison='up',
                        threshold=threshold, seeds=1), **extra)


_CODE = """
def verdict_all_up(rule, m):
  ups = [c['change'] > rule['threshold'] * c['se'] for c in m['changes']]
  return 'holds' if all(ups) else f'{sum(ups)}/{len(ups)}'


def main_job(files):
  return 'text', dict(changes=[])


MEASURES = dict(main_job=main_job)
"""


@pytest.fixture
def repo(tmp_path):
  # A repository with the claims' code: one verdict, one measure.
  _git(tmp_path, 'init', '-q')
  (tmp_path / 'experiments' / 'claims').mkdir(parents=True)
  (tmp_path / 'experiments' / 'claims' / 'code.py').write_text(_CODE)
  _commit(tmp_path, 'code')
  return tmp_path


def test_a_rule_committed_before_its_results_passes(repo):
  _write(repo, 'docs/claims/x.json', _rule())
  _commit(repo, 'rule')
  _write(repo, 'res/a.json', dict(meta=dict(dirty=False)))
  _commit(repo, 'results')
  assert history.check(str(repo), deciders=_deciders(repo)) == []
  # Nothing in the rule file changes after its results, not even its words.
  _write(repo, 'docs/claims/x.json', dict(_rule(), command='run it again'))
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and "['command']" in problems[0], problems
  _write(repo, 'docs/claims/x.json', _rule(threshold=1.0))
  _commit(repo, 'rule changed after the results')
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and "changed after its first result" in problems[
      0] and "['rule']" in problems[0], problems


def test_a_change_to_the_code_that_decides_after_the_results_fails(repo):
  _write(repo, 'docs/claims/x.json', _rule())
  _commit(repo, 'rule')
  _write(repo, 'res/a.json', dict(meta=dict(dirty=False)))
  _commit(repo, 'results')
  code = repo / 'experiments' / 'claims' / 'code.py'
  # Words, comments and a helper's leading underscore are not a change.
  code.write_text(_CODE.replace("  ups = [", "  # the rule's test\n  ups = ["))
  assert history.check(str(repo), deciders=_deciders(repo)) == []
  # The verdict's threshold use, or the measure's numbers, are.
  code.write_text(_CODE.replace("rule['threshold'] *", '1.0 *'))
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'verdict function verdict_all_up changed' in (
      problems[0]), problems
  code.write_text(_CODE.replace('changes=[]', 'changes=[1]'))
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'measure function main_job changed' in (
      problems[0]), problems
  # A later rule may use the new code: this one keeps the old (frozen).
  _commit(repo, 'the measure changed')
  _write(repo, 'docs/claims/y.json', _rule(results='res2/*.json'))
  _commit(repo, 'a new rule')
  _write(repo, 'res2/a.json', dict(meta=dict(dirty=False)))
  _commit(repo, 'its results')
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'docs/claims/x.json' in problems[0], problems


def test_moved_results_keep_the_commit_that_made_them(repo, monkeypatch):
  _write(repo, 'docs/claims/x.json', _rule())
  _commit(repo, 'rule')
  _write(repo, 'res/a.json', dict(meta=dict(dirty=False)))
  _commit(repo, 'results')
  _git(repo, 'mv', 'res', 'moved')
  _write(repo, 'docs/claims/x.json', _rule(results='moved/*.json'))
  _commit(repo, 'results moved')
  # The rule's new path is a change unless the move is declared.
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and "['results']" in problems[0], problems
  monkeypatch.setattr(history, 'MOVED', {'res/': 'moved/'})
  assert history.check(str(repo), deciders=_deciders(repo)) == []


def test_runs_begun_before_their_rule_are_marked(repo):
  head = lambda: subprocess.run(['git', '-C', str(repo), 'rev-parse', 'HEAD'],
                                capture_output=True, text=True).stdout.strip()
  before = head()
  _write(repo, 'docs/claims/x.json', _rule())
  _commit(repo, 'rule')
  after = head()
  _write(repo, 'res/a.json', dict(meta=dict(commit=after, dirty=False,
                                            date='2999-01-01T00:00:00+00:00')))
  _commit(repo, 'results')
  assert history.early_runs(str(repo)) == {}
  # Made at a commit without the rule.
  _write(repo, 'res/b.json', dict(meta=dict(commit=before, dirty=False,
                                            date='2999-01-01T00:00:00+00:00')))
  # Started before the rule's commit.
  _write(repo, 'res/c.json', dict(meta=dict(commit=after, dirty=False,
                                            date='2000-01-01T00:00:00+00:00')))
  _commit(repo, 'more results')
  assert history.early_runs(str(repo)) == {'x': ['res/b.json', 'res/c.json']}


def test_results_with_or_before_their_rule_fail_unless_post_hoc(repo):
  _write(repo, 'res/a.json', {})
  _write(repo, 'docs/claims/x.json', _rule())
  _commit(repo, 'rule and results together')
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'x.json' in problems[0], problems
  _write(repo, 'docs/claims/x.json', _rule(post_hoc='written afterwards'))
  _commit(repo, 'marked')   # a post hoc rule is checked for its mark only
  assert history.check(str(repo), deciders=_deciders(repo)) == []


def test_a_post_hoc_mark_on_a_rule_that_came_first_fails(repo):
  _write(repo, 'docs/claims/x.json', _rule(post_hoc='not true'))
  _commit(repo, 'rule')
  _write(repo, 'res/a.json', {})
  _commit(repo, 'results')
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'drop post_hoc' in problems[0], problems


def test_results_of_a_registered_rule_from_a_dirty_tree_fail(repo):
  _write(repo, 'docs/claims/x.json', _rule())
  _commit(repo, 'rule')
  _write(repo, 'res/a.json', dict(meta=dict(dirty=True)))
  _commit(repo, 'results')
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'dirty' in problems[0], problems


def test_uncommitted_results_of_a_committed_rule_pass(repo):
  _write(repo, 'docs/claims/x.json', _rule())
  _commit(repo, 'rule')
  _write(repo, 'res/a.json', {})
  assert history.check(str(repo), deciders=_deciders(repo)) == []


def test_given_files_must_come_before_their_rule(repo):
  # Another rule's finished runs a new rule reads (its comparison arm).
  _write(repo, 'old/a.json', dict(meta=dict(dirty=False)))
  _commit(repo, 'earlier runs')
  _write(repo, 'docs/claims/x.json', _rule(given='old/*.json'))
  assert rules_lib.result_files(_rule(given='old/*.json'), str(repo), 'all') \
      == ['old/a.json']
  # The rule not committed yet:
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'old/a.json (given' in problems[0], problems
  _commit(repo, 'rule')
  assert history.check(str(repo), deciders=_deciders(repo)) == []
  # A given file added with or after the rule is a result by another name.
  _write(repo, 'old/b.json', dict(meta=dict(dirty=False)))
  _commit(repo, 'a late given file')
  problems = history.check(str(repo), deciders=_deciders(repo))
  assert len(problems) == 1 and 'old/b.json (given' in problems[0], problems
  assert 'old/a.json' not in problems[0]


def test_a_malformed_rule_file_is_named(repo):
  _write(repo, 'docs/claims/x.json', dict(_rule(), extra=1))
  with pytest.raises(ValueError, match=r'docs/claims/x.json: fields'):
    rules_lib.load_rules(str(repo))
  bad = _rule()
  bad['rule']['verdict'] = 'nope'
  _write(repo, 'docs/claims/x.json', bad)
  with pytest.raises(ValueError, match="unknown verdict 'nope'"):
    rules_lib.load_rules(str(repo))
  del bad['rule']['seeds']
  _write(repo, 'docs/claims/x.json', bad)
  with pytest.raises(ValueError, match=r"lacks \['seeds'\]"):
    rules_lib.load_rules(str(repo))


def test_history_is_unavailable_outside_git(tmp_path):
  os.makedirs(tmp_path / 'docs' / 'claims')
  assert history.available(str(tmp_path)) == 'not a git checkout'


# ------------------------------------------- measures on synthetic files

def _scores(rates):
  """{domain: score} with 40 prompts whose pass rates average `rate`."""
  out = {}
  for d, rate in rates.items():
    k = round(rate * 40)
    out[d] = dict(pass_rate=k / 40, pass_se=0.05,
                  prompt_pass={str(i): float(i < k) for i in range(40)})
  return out


def _report(tmp_path, name, math_after):
  stages = [
      dict(name='sft', kind='sft', init_from='', domains=[],
           scores=_scores(dict(math=0.5, instruction_following=0.2))),
      dict(name='if_rl', kind='grpo', init_from='sft', branch=False,
           domains=['instruction_following'],
           scores=_scores(dict(math=math_after, instruction_following=0.4))),
  ]
  path = tmp_path / name / 'report.json'
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps(dict(stages=stages)))
  return str(path)


def test_the_forgetting_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('8_forgetting')
  files = [_report(tmp_path, f's{i}', m) for i, m in enumerate((0.2, 0.2))]
  text, m = measures.MEASURES['forgetting'](files)
  assert m['seeds'] == 2 and list(m['stage_drops']) == ['if_rl math']
  assert m['stage_drops']['if_rl math'][0]['change'] == pytest.approx(-0.3)
  assert 'if_rl math -0.300 (2)' in text, text
  assert _verdict(rule, m) == 'open (2 of 3 seeds)'
  files.append(_report(tmp_path, 's2', 0.5))
  _, m = measures.MEASURES['forgetting'](files)
  # The last stage (if_rl) ends math below SFT in 2 of 3 seeds.
  assert _verdict(rule, m) == 'no: below SFT at the end in math'


def test_the_if_rl_measure_decides_on_the_passed_arm(tmp_path):
  rule = _rule_of('9_if_rl_reward')
  files = []
  for arm, changes in (('if_rl_passed', (0.1, 0.08, 0.0)),
                       ('if_rl_graded', (0.0, 0.0, 0.0))):
    for s, ch in enumerate(changes):
      path = tmp_path / arm / f'seed{s}' / 'rerun.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(rows=[dict(
          domain='instruction_following', before=0.2, after=0.2 + ch,
          change=ch, se=0.02)])))
      files.append(str(path))
  text, m = measures.MEASURES['if_rl_reward'](files)
  assert 'if_rl_passed: IF +0.100, +0.080, +0.000 (3 seeds, 2 up' in text
  assert _verdict(rule, m) == 'holds'


def test_the_recovery_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('10_mopd_recovers')
  files = []
  teachers = dict(math=dict(stage='sft', score=0.5),
                  code=dict(stage='if_rl', score=0.4))
  for s in range(3):
    for arm, (dm, dc) in (('mopd', (0.1, 0.05)), ('grpo', (0.05, 0.0))):
      path = tmp_path / f'seed{s}' / arm / 'rerun.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(
          recover=dict(after='long_context_rl', teachers=teachers),
          rows=[dict(domain='math', before=0.3, after=0.3 + dm, change=dm,
                     se=0.02),
                dict(domain='code', before=0.3, after=0.3 + dc, change=dc,
                     se=0.02),
                dict(domain='swe', before=0.5, after=0.45, change=-0.05,
                     se=0.02)])))
      files.append(str(path))
  text, m = measures.MEASURES['recovery'](files)
  # math: +0.1 of a 0.2 gap; code +0.05 of 0.1: half of each gap.
  assert ('math: MOPD +0.100 (3 of 3 seeds up beyond 2 paired SE; 50% of '
          'the gap to its teacher closed), GRPO +0.050 (3 of 3)') in text, text
  assert 'code: MOPD +0.050 (3 of 3' in text and 'code <- if_rl' in text
  assert 'MOPD elsewhere, worst: swe -0.050' in text
  assert _verdict(rule, m) == 'holds'


def test_the_long_context_mix_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('11_long_context_mix')
  files = []
  for arm, (dl, dm) in (('alone', (0.1, -0.08)), ('mixed', (0.08, -0.02))):
    for s in range(3):
      path = tmp_path / 'lc_mix' / arm / f'seed{s}' / 'rerun.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(rows=[
          dict(domain=d, own=d == 'long_context', before=0.4, after=0.4 + c,
               change=c, se=0.02)
          for d, c in (('long_context', dl), ('math', dm), ('code', dm),
                       ('swe', 0.0))])))
      files.append(str(path))
  text, m = _measure(rule)(files)
  assert ('math -0.080 alone / -0.020 mixed (mixed above in 3 of 3)'
          in text), text
  assert 'long +0.100 alone / +0.080 mixed' in text
  assert _verdict(rule, m) == 'holds'


def test_the_learning_rate_remedy_reads_its_named_arms(tmp_path):
  # Rule 24's arms are 'default' (the baseline) and 'lr1e-4': the same
  # measure and verdict as the long-context mix, by the arms' names.
  rule = _rule_of('24_lc_lr_hybrid')
  assert rule['rule']['arms'] == ['default', 'lr1e-4']

  def measured(changes):
    files = []
    for arm, (dl, dm, dc) in changes.items():
      for s in range(3):
        path = tmp_path / str(len(changes)) / arm / f'seed{s}' / 'rerun.json'
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(rows=[
            dict(domain=d, own=d == 'long_context', before=0.4,
                 after=0.4 + c, change=c, se=0.02)
            for d, c in (('long_context', dl), ('math', dm), ('code', dc))])))
        files.append(str(path))
    return measures.MEASURES['lc_mix'](files)
  text, m = measured({'default': (0.1, -0.1, -0.05),
                      'lr1e-4': (0.06, -0.02, -0.01)})
  assert ('math -0.100 default / -0.020 lr1e-4 (lr1e-4 above in 3 of 3)'
          in text), text
  assert _verdict(rule, m) == 'holds'
  # Kept math and code, but the lower rate no longer lifts long context.
  _, m = measured({'default': (0.1, -0.1, -0.05),
                   'lr1e-4': (0.01, -0.02, -0.01), 'x': (0, 0, 0)})
  assert _verdict(rule, m) == \
      'partly: math, code kept, long_context not lifted'


def test_the_stage_order_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('12_stage_order')
  files = []
  ends = dict(default=dict(math=0.6, code=0.5), cascade1=dict(math=0.4,
              code=0.5), code_first=dict(math=0.6, code=0.5))
  for arm, end in ends.items():
    for s in range(3):
      stages = [dict(name='sft', kind='sft', scores=_scores(dict(
                    math=0.5, code=0.3))),
                dict(name='rlhf_branch', kind='grpo', branch=True,
                     scores=_scores(dict(math=0.9, code=0.9))),
                dict(name='last', kind='grpo', branch=False,
                     scores=_scores(end))]
      path = tmp_path / 'stage_order' / arm / f'seed{s}' / 'report.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(stages=stages)))
      files.append(str(path))
  text, m = _measure(rule)(files)
  # math 0.6 against 0.4 (8 of 40 prompts differ), code equal: macro +0.1.
  assert m['diffs']['cascade1'][0]['diff'] == pytest.approx(0.1)
  assert m['diffs']['code_first'][0]['diff'] == pytest.approx(0.0)
  assert 'cascade1: +0.100' in text and 'math +0.200' in text, text
  assert _verdict(rule, m) == 'partly: ahead of cascade1'
  # An arm from another SFT voids the comparison.
  doc = json.loads(open(files[-1]).read())
  doc['stages'][0]['scores'] = _scores(dict(math=0.4, code=0.3))
  open(files[-1], 'w').write(json.dumps(doc))
  _, m = _measure(rule)(files)
  assert _verdict(rule, m).startswith('void (seed2: code_first')


def test_the_kl_main_measure_reads_the_committed_jobs():
  rule = _rule_of('13_rlhf_kl_main')
  text, m = measures.MEASURES['kl_main'](rules_lib.result_files(rule))
  # compare.py's figures (README.md of rlhf_kl_main): (a) fails in every
  # seed; (b) fails in seeds 0 (long context) and 2 (preference).
  assert [(s['a'], s['b']) for s in m['seeds']] == [
      (False, False), (False, True), (False, False)]
  assert 'seed 2: pref after rlhf -0.123' in text, text
  assert _verdict(rule, m) == '0.1 stays (both parts in 0 of 3 seeds)'


def test_the_mopd_gap_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('14_mopd_gap')
  files = []
  for part, seeds in (('a', (0, 2, 4)), ('b', (1, 3))):
    runs = {}
    for s in seeds:
      steps = [0, 2, 4]
      # MOPD ahead by 0.05 then 0.03 (+ a seed-dependent 0.001 s).
      runs[str(s)] = dict(
          teacher=dict(score=0.7, se=0.02),
          grpo=dict(steps=steps, scores=[0.4, 0.45, 0.5], ses=[0.02] * 3),
          mopd=dict(steps=steps, scores=[0.4, 0.5 + 0.001 * s, 0.53],
                    ses=[0.02] * 3))
    path = tmp_path / 'mopd_gap' / part / 'results.json'
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dict(runs=runs)))
    files.append(str(path))
  text, m = measures.MEASURES['mopd_gap'](files)
  assert len(m['per_seed']) == 5 and m['per_seed'][0] == pytest.approx(0.04)
  assert m['gap_se'] == pytest.approx(15.0)          # (0.7 - 0.4) / 0.02
  assert m['per_step'][2] == pytest.approx([0.05, 0.051, 0.052, 0.053, 0.054])
  assert 'teacher above the start by 15.0 SE' in text, text
  assert _verdict(rule, m) == 'holds'


def test_the_own_domain_measure_counts_seeds_per_stage(tmp_path):
  rule = _rule_of('15_own_domain_hybrid')
  files = [_report(tmp_path, f's{i}', 0.5) for i in range(3)]
  text, m = measures.MEASURES['own_domain_seeds'](files)
  # if_rl lifts IF 0.2 -> 0.4 in every seed (40 prompts: 8 flip).
  assert list(m['pairs']) == ['if_rl IF'] and len(m['pairs']['if_rl IF']) == 3
  assert 'if_rl IF +0.200 (3)' in text, text
  assert _verdict(rule, m) == 'holds'


def test_the_if_hurts_measure_reads_each_seeds_main_job(tmp_path):
  rule = _rule_of('35_if_hurts_seeds')
  files = []
  for i, (if_rl, rlhf) in enumerate(((0.2, 0.7), (0.3, 0.6), (0.5, 0.5))):
    pref = lambda r: _scores(dict(preference=r))
    stages = [dict(name='sft', kind='sft', init_from='', scores=pref(0.5)),
              dict(name='if_rl', kind='grpo', init_from='sft',
                   scores=pref(if_rl)),
              dict(name='mopd', kind='mopd', init_from='if_rl',
                   scores=pref(0.5)),
              dict(name='rlhf', kind='grpo', init_from='mopd',
                   scores=pref(rlhf))]
    path = tmp_path / f'seed{i}' / 'report.json'
    path.parent.mkdir()
    path.write_text(json.dumps(dict(stages=stages)))
    files.append(str(path))
  text, m = measures.MEASURES['if_hurts_seeds'](files)
  # IF-RL from SFT's 0.5 (its init_from), RLHF against that SFT.
  assert [s['hurt']['change'] for s in m['seeds']] == pytest.approx(
      [-0.3, -0.2, 0.0])
  assert [s['recovered']['change'] for s in m['seeds']] == pytest.approx(
      [0.2, 0.1, 0.0])
  assert '0.500 -> 0.200 / 0.700' in text and 'down beyond 2 paired SE ' \
      'in 2, RLHF above SFT beyond 2 paired SE in 2' in text, text
  assert _verdict(rule, m) == 'holds'
