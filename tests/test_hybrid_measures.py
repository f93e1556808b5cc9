"""The measures of the claims decided on the hybrid only (experiments/claims/hybrid_measures.py), fed known results."""

import json

from experiments.claims import measures
from experiments.claims import rules as rules_lib
from experiments.claims import verdicts

from _claims_helpers import measure as _measure
from _claims_helpers import rule_of as _rule_of
from _claims_helpers import verdict as _verdict


def test_the_hybrid_rlhf_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('17_hybrid_rlhf')
  files = []
  for arm, pref in (('default', 0.0), ('lr5e-4', 0.06), ('kl0.03', 0.03),
                    ('steps30', 0.09)):
    for s in range(3):
      path = tmp_path / 'hybrid_rlhf' / arm / f'seed{s}' / 'rerun.json'
      path.parent.mkdir(parents=True)
      math = -0.2 if arm == 'steps30' else -0.05
      path.write_text(json.dumps(dict(rows=[
          dict(domain='preference', before=0.2, after=0.2 + pref,
               change=pref, se=0.01),
          dict(domain='math', before=0.6, after=0.6 + math, change=math,
               se=0.02)])))
      files.append(str(path))
  text, m = _measure(rule)(files)
  assert sorted(m['arms']) == sorted(rule['rule']['arms'])
  assert 'lr5e-4: pref +0.060 (+0.060, +0.060, +0.060; 3 up beyond 2 SE)' \
      ', math -0.050' in text, text
  # steps30 lifts preference most but costs math beyond 2 SE: lr5e-4.
  assert _verdict(rule, m) == 'lr5e-4 becomes the setting'
  assert _verdict(rule, _measure(rule)(files[:-1])[1]) \
      == 'open (default 3 of 3, lr5e-4 3 of 3, kl0.03 3 of 3, steps30 2 of 3 seeds)'


def test_the_hybrid_sft_mix_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('21_sft_mix_hybrid')
  assert 'post_hoc' not in rule
  files = []

  def scores(pref: list[int], math: list[int]) -> dict:
    out = {}
    for d, p in (('preference', pref), ('math', math)):
      out[d] = dict(pass_rate=sum(p) / len(p), pass_se=0.05,
                    prompt_pass={str(i): v for i, v in enumerate(p)})
    return out

  # Eight prompts; the arm passes 2 more preference prompts in seeds 0, 1
  # and the same in seed 2; math loses one prompt in every seed.
  base_pref = [1, 0, 0, 0, 0, 0, 0, 0]
  for s in range(3):
    for arm in ('default', 'pref1.5'):
      up = arm != 'default'
      pref = ([1, 1, 1, 0, 0, 0, 0, 0] if up and s < 2 else base_pref)
      math = [1, 1, 1, 1, 0, 0, 0, 0] if not up else [1, 1, 1, 0, 0, 0, 0, 0]
      path = tmp_path / 'hybrid_sft_mix' / arm / f'seed{s}' / 'report.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(stages=[dict(
          name='sft', scores=scores(pref, math))])))
      files.append(str(path))
  text, m = measures.MEASURES['sft_mix'](files)
  assert [round(c['change'], 3) for c in m['changes']] == [0.25, 0.25, 0.0]
  # A paired SE of 2 of 8 prompts moved: sqrt(var / n) with var = 2/8 * 6/8 * 8/7.
  assert abs(m['changes'][0]['se'] - 0.1637) < 1e-3
  assert ('pref1.5 against default, SFT preference: 0.125 -> 0.375 (+0.250)'
          in text and '(0 of 3 seeds up beyond 2 paired SE)' in text
          and 'math -0.125 (0)' in text), text
  assert _verdict(rule, m) == 'no'
  assert _verdict(rule, measures.MEASURES['sft_mix'](files[:-1])[1]) \
      == 'open (2 of 3 seeds)'


def test_the_hybrid_if_hurts_measure_feeds_its_rule(tmp_path):
  # Rule 28: IF-RL's preference change per seed (one seed down beyond 2
  # SE: hurts) and RLHF's preference after, mean over its Bradley-Terry
  # reruns, against the base's SFT (above: recovers).
  rule = _rule_of('28_if_hurts_hybrid')
  assert 'post_hoc' not in rule

  def measured(if_changes, rlhf_after):
    root = tmp_path / str(len(list(tmp_path.iterdir())))
    base = root / 'hybrid_if_hurts' / 'base' / 'report.json'
    base.parent.mkdir(parents=True)
    base.write_text(json.dumps(dict(stages=[dict(
        name='sft', scores=dict(preference=dict(pass_rate=0.3)))])))
    files = [str(base)]
    for s, c in enumerate(if_changes):
      path = root / 'hybrid_if_hurts' / 'if_rl' / f'seed{s}' / 'rerun.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(rows=[dict(
          domain='preference', before=0.3, after=0.3 + c, change=c,
          se=0.02)])))
      files.append(str(path))
    for s, a in enumerate(rlhf_after):
      path = root / 'hybrid_rlhf_reward' / f'bt_kl0.1_seed{s}' / 'rerun.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(rows=[dict(
          domain='preference', before=0.25, after=a, change=a - 0.25,
          se=0.02)])))
      files.append(str(path))
    return measures.MEASURES[rule['measure']](files)

  text, m = measured([-0.06, -0.01, 0.0], [0.33, 0.35, 0.34])
  assert text == ('IF-RL changes pref -0.060, -0.010, +0.000 (3 seeds, 1 '
                  'beyond 2 SE) from SFT 0.300; RLHF (Bradley-Terry) from '
                  'MOPD over 3 seeds: 0.250 -> 0.340 (SFT 0.300)'), text
  assert _verdict(rule, m) == 'holds'
  # RLHF ends below SFT: IF-RL hurts, RLHF does not recover.
  assert _verdict(rule, measured([-0.06, -0.01, 0.0],
                                       [0.2, 0.25, 0.3])[1]) == 'no'
  # No seed down beyond 2 SE, RLHF above SFT.
  assert _verdict(rule, measured([-0.03, 0.01, 0.0],
                                       [0.33, 0.35, 0.34])[1]) == \
      'RLHF recovers; IF-RL does not hurt here'


def test_the_kl_main_measure_feeds_the_hybrid_rule(tmp_path):
  """Rule 30: the hybrid main job at KL 0.03 against rule 29's default arm."""
  rule = _rule_of('30_rlhf_kl_main_hybrid')
  assert 'post_hoc' not in rule and rule['measure'] == 'kl_main'

  def stages(pref: list[int], last: list[int]) -> list[dict]:
    def scores(p):
      return dict(preference=dict(
          pass_rate=sum(p) / len(p), pass_se=0.05,
          prompt_pass={str(i): v for i, v in enumerate(p)}))
    same = scores([1, 0, 0, 0])
    return [dict(name=n, scores=same)
            for n in ('sft', 'if_rl', 'multi_domain_rl')] + [
                dict(name='rlhf', scores=scores(pref)),
                dict(name='swe_agent_rl', scores=scores(last))]

  # Eight prompts. Seed 0: 0.03 ahead after rlhf, the last stage level;
  # seed 1: behind after rlhf; seed 2: ahead, but the last stage six prompts
  # lower (beyond 2 paired SE).
  eight = [1, 1, 1, 1, 1, 1, 0, 0]
  arms = {'0.1': [(eight, eight)] * 3,
          '0.03': [([1] * 8, eight), ([1, 1, 0, 0, 0, 0, 0, 0], eight),
                   ([1] * 8, [0] * 8)]}
  files = []
  for kl, runs in arms.items():
    for s, (pref, last) in enumerate(runs):
      d = ('hybrid_rlhf_kl_main' if kl == '0.03'
           else 'hybrid_stage_order/default')
      path = tmp_path / 'claims_x' / d / f'seed{s}' / 'report.json'
      path.parent.mkdir(parents=True)
      path.write_text(json.dumps(dict(stages=stages(pref, last))))
      files.append(str(path))
  text, m = measures.MEASURES['kl_main'](files)
  assert [(x['a'], x['b']) for x in m['seeds']] == [
      (True, True), (False, True), (True, False)], text
  assert 'seed 2: pref after rlhf +0.250' in text, text
  assert _verdict(rule, m) == '0.1 stays (both parts in 1 of 3 seeds)'
  # Seed 1 level after rlhf: both parts in 2 seeds.
  doc = json.loads(open(files[4]).read())
  doc['stages'][3] = stages(eight, eight)[3]
  open(files[4], 'w').write(json.dumps(doc))
  _, m = measures.MEASURES['kl_main'](files)
  assert _verdict(rule, m) == '0.03 becomes the default'
  # Two seeds only: open; a run that differs before RLHF: void.
  assert _verdict(rule, measures.MEASURES['kl_main'](
      files[:2] + files[3:5])[1]) == 'open (2 of 3 seeds)'
  doc['stages'][0] = dict(name='sft', scores=stages([0] * 4, eight)[3][
      'scores'])
  open(files[4], 'w').write(json.dumps(doc))
  _, m = measures.MEASURES['kl_main'](files)
  assert _verdict(rule, m).startswith('void (seed 1: the runs differ')


def test_verdict_adopt_if_ahead():
  # The settings rule adopts an arm ahead that costs no domain.
  rule = _rule_of('31_settings_hybrid')['rule']
  seed = lambda diff, se=0.01: dict(diff=diff, se=se)
  dom = lambda *diffs: [seed(x) for x in diffs]
  ahead = [seed(-0.05), seed(-0.04), seed(0.0)]        # default - tuned
  m = dict(diffs=dict(tuned=ahead),
           per_domain=dict(tuned=dict(math=dom(0.03, -0.01, 0.0),
                                      pref=dom(-0.1, -0.1, 0.0))))
  assert verdicts.verdict_adopt_if_ahead(rule, m) == \
      'tuned adopted (ahead in 2 of 3 seeds)'
  m['per_domain']['tuned']['math'] = dom(0.03, 0.04, 0.0)
  assert verdicts.verdict_adopt_if_ahead(rule, m) == (
      'not adopted: tuned ahead in 2 of 3 seeds but lower in math')
  m['diffs']['tuned'] = [seed(0.05), seed(0.03), seed(-0.05)]
  assert verdicts.verdict_adopt_if_ahead(rule, m) == (
      'no: the default ahead in 2 of 3 seeds')
  m['diffs']['tuned'] = [seed(0.01), seed(-0.01), seed(-0.05)]
  assert verdicts.verdict_adopt_if_ahead(rule, m) == (
      'not shown at this scale (the default stays)')
  assert verdicts.verdict_adopt_if_ahead(
      rule, dict(diffs=dict(tuned=ahead[:2]), per_domain={})) == (
          'open (2 of 3 seeds)')
  assert verdicts.verdict_adopt_if_ahead(rule, dict(void='x')) == 'void (x)'


def test_the_settings_measure_feeds_its_rule(tmp_path):
  """Rule 31: the tuned hybrid (its own SFT) against rule 29's default arm."""
  rule = _rule_of('31_settings_hybrid')
  assert 'post_hoc' not in rule and rule['measure'] == 'settings'

  def report(sft: list[int], last: dict) -> dict:
    def scores(per_domain):
      return {d: dict(pass_rate=sum(p) / len(p), pass_se=0.05,
                      prompt_pass={str(i): v for i, v in enumerate(p)})
              for d, p in per_domain.items()}
    return dict(stages=[
        dict(name='sft', scores=scores(dict(math=sft, preference=sft))),
        dict(name='swe_agent_rl', scores=scores(last))])

  # 16 prompts a domain. Default: half passed in both domains. Tuned (an
  # SFT of its own): preference 6 prompts up in every seed, math level.
  half = [1] * 8 + [0] * 8
  files = []
  for s in range(3):
    for arm, d, last in (
        ('default', 'hybrid_stage_order/default', dict(
            math=half, preference=half)),
        ('tuned', 'hybrid_settings/tuned', dict(
            math=half, preference=[1] * 14 + [0] * 2))):
      path = tmp_path / 'claims_x' / d / f'seed{s}' / 'report.json'
      path.parent.mkdir(parents=True)
      sft = half if arm == 'default' else [1] * 10 + [0] * 6
      path.write_text(json.dumps(report(sft, last)))
      files.append(str(path))
  text, m = measures.MEASURES['settings'](files)
  assert 'the default minus tuned: -0.188 (SE' in text, text
  assert _verdict(rule, m) == 'tuned adopted (ahead in 3 of 3 seeds)'
  # The stage orders' measure voids arms from other SFTs; this one does
  # not, but voids arms scored on other prompts.
  assert measures.MEASURES['stage_order'](files)[1]['void']
  doc = json.loads(open(files[-1]).read())
  doc['stages'][0]['scores']['math']['prompt_pass'] = {'99': 1}
  open(files[-1], 'w').write(json.dumps(doc))
  _, m = measures.MEASURES['settings'](files)
  assert _verdict(rule, m) == 'void (seed2: tuned is scored on other prompts)'


def _mopd_rerun(tmp_path, arm, seed, own, other, se=0.01):
  path = tmp_path / 'hybrid_mopd' / arm / f'seed{seed}' / 'rerun.json'
  path.parent.mkdir(parents=True)
  rows = [dict(domain=d, own=True, before=0.3, after=0.3 + c, change=c, se=se)
          for d, c in zip(('math', 'preference'), own)]
  rows.append(dict(domain='code', own=False, before=0.4, after=0.4 + other,
                   change=other, se=se))
  path.write_text(json.dumps(dict(rows=rows)))
  return str(path)


def _mopd_report(tmp_path, seed, mopd_after):
  """A hybrid main job's report: MOPD from multi_domain_rl, its math
  teacher sft 0.05 above the start, its preference teacher the start."""
  score = lambda p: dict(pass_rate=p, pass_se=0.01)
  start = dict(math=0.3, preference=0.3, code=0.4)
  stages = [dict(name='sft', scores={d: score(p + (0.05 if d == 'math'
                                                   else 0.0))
                                     for d, p in start.items()}),
            dict(name='multi_domain_rl',
                 scores={d: score(p) for d, p in start.items()}),
            dict(name='mopd', init_from='multi_domain_rl',
                 teachers=dict(math='sft', preference='multi_domain_rl'),
                 scores={d: score(p) for d, p in mopd_after.items()})]
  path = tmp_path / 'hybrid_stage_order' / 'default' / f'seed{seed}' / \
      'report.json'
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps(dict(stages=stages)))
  return str(path)


def test_the_hybrid_mopd_measure_feeds_its_rule(tmp_path):
  rule = _rule_of('32_mopd_hybrid')
  assert rule['rule']['arms'] == ['default', 'steps36', 'lr5e-4']
  files = []
  for s in range(3):
    files.append(_mopd_rerun(tmp_path, 'default', s, (0.0, 0.01), 0.0))
    # Up in MOPD's domains (macro +0.04, SE 0.007) without a cost elsewhere.
    files.append(_mopd_rerun(tmp_path, 'steps36', s, (0.03, 0.05), -0.01))
    # Up further, but the other domains fall beyond 2 SE below the default.
    files.append(_mopd_rerun(tmp_path, 'lr5e-4', s, (0.06, 0.06), -0.05))
    # Seed 2's main job scored its MOPD otherwise than the default arm.
    files.append(_mopd_report(tmp_path, s, dict(
        math=0.3, preference=0.31, code=0.4 + 0.1 * (s == 2))))
  text, m = measures.MEASURES['hybrid_mopd'](files)
  assert sorted(m['arms']) == sorted(rule['rule']['arms'])
  assert abs(m['arms']['steps36'][0]['mopd'] - 0.04) < 1e-12
  assert abs(m['arms']['steps36'][0]['mopd_se']
             - (2 * 0.01 ** 2) ** 0.5 / 2) < 1e-12
  assert ("steps36: MOPD's domains +0.040 (+0.040, +0.040, +0.040; 3 up "
          'beyond 2 SE), others -0.010; math +0.030, pref +0.050') in text
  assert 'math <- sft +0.050 (3), pref <- multi_domain_rl +0.000 (0)' in text
  assert m['reproduced'] == [True, True, False]
  assert "equals the main job's MOPD in 2 of 3 seeds" in text
  assert _verdict(rule, m) == 'steps36 becomes the setting'
  # Without steps36: lr5e-4's cost elsewhere disqualifies it, and the
  # default (macro +0.005, SE 0.007) is not up: the rule's own words.
  m['arms']['steps36'] = m['arms']['default']
  assert _verdict(rule, m) == \
      'not made to work by steps or lr at this scale'
  assert _verdict(rule, measures.MEASURES['hybrid_mopd'](files[1:])[1]) \
      == 'open (default 2 of 3, steps36 3 of 3, lr5e-4 3 of 3 seeds)'


def test_the_settings_measure_reads_the_sft_weight_arm_beside_rule_29s():
  # Rule 33's arm (pref1.5) against rule 29's default arm, both read
  # through its own globs ('given' for the default's), arms named by
  # folder: the measure sees the two arms, and nothing of rule 31's.
  rule = _rule_of('33_sft_pref_hybrid')
  assert sorted(rule['rule']['arms']) == ['default', 'pref1.5']
  files = rules_lib.result_files(rule, key='all')
  assert files and all('/hybrid_sft_pref/pref1.5/' in f
                       or '/hybrid_stage_order/default/' in f for f in files)
  _, m = measures.MEASURES[rule['measure']](files)
  assert set(m['macro']) <= {'default', 'pref1.5'}
