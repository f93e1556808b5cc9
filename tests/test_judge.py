"""The generative pairwise judge: its training data, its verdicts as an RLHF reward (both orders, groups, length), a stage end to end."""

import json

import numpy as np
import pytest

from cascade_jax import domains
from cascade_jax import reward_model
from cascade_jax.reward_model import _judge


@pytest.fixture(scope='session')
def quick_sft_run(tmp_path_factory):
  """A few steps of the quick SFT on preference and multi-domain data (the
  judge's tokens 'A' and 'B' come from the multiple-choice answers; on the
  whole mix 12 judge steps leave it answering neither in 0.64 of the held-out
  pairs). Made once for the session."""
  from cascade_jax import sft
  from configs import sft as sft_config
  import conftest  # pylint: disable=g-import-not-at-top

  def build(d):
    c = sft_config.get_config('quick')
    c.mesh = type(c.mesh)({})
    c.steps, c.eval_n = 4, 0
    c.data.sources = type(c.data.sources)(
        {k: v for k, v in c.data.sources.items()
         if k in ('preference', 'multi_domain')})
    sft.run(c, d)
  return conftest.shared_run(tmp_path_factory, 'judge_sft', build)


class _FakeJudge:
  """P(reply A better) from a rule, plus a fixed liking for position A."""

  def __init__(self, better, position_bias=0.0):
    self.better, self.bias, self.calls = better, position_bias, []
    self.last_dropped = 0.0

  def p_first(self, items):
    self.calls.append(list(items))
    p = np.asarray([self.better(a, b) for _, a, b in items], np.float64)
    return np.clip(p + self.bias, 0, 1), (p < 0.5).astype(int)

  prefers = _judge.Judge.prefers


def _longer(a, b):
  return 1.0 if len(a) > len(b) else 0.0 if len(a) < len(b) else 0.5


def _group(rid, n):
  return [dict(id=rid, messages=[{'role': 'user', 'content': f'q{rid}'}],
               chosen=f'good {rid}.')] * n


def test_training_items_hold_each_pair_in_both_orders():
  recs = domains.generate('preference', split='train', n=6, seed=0)
  items = _judge.training_items(recs, np.random.default_rng(0),
                                cross_prompt=False)
  assert len(items) == 12
  for r in recs:
    q = r['messages'][-1]['content']
    assert ((q, r['chosen'], r['rejected']), 0) in items
    assert ((q, r['rejected'], r['chosen']), 1) in items
  cross = _judge.training_items(recs, np.random.default_rng(0),
                                cross_prompt=True)
  assert len(cross) == 24
  # A cross-prompt pair: the chosen reply against another topic's answer.
  others = [x for x, v in cross if v == 0 and x[2] not in
            {r['rejected'] for r in recs}]
  assert others and all(x[2] != x[1] for x in others)


def test_group_rewards_are_win_rates_over_both_orders():
  fake = _FakeJudge(_longer)
  fn = _judge.JudgeReward(fake)
  recs = _group('a', 3) + _group('b', 2)
  resp = ['x', 'xxx', 'xx', 'yy', 'y']
  r = fn(recs, resp)
  np.testing.assert_allclose(r, [0.0, 1.0, 0.5, 1.0, 0.0])
  # Every ordered pair of a group once (so each pair in both orders),
  # nothing across groups.
  (items,) = fake.calls
  assert len(items) == 3 * 2 + 2 * 1
  assert len(set(items)) == len(items)
  assert all(q == ('qa' if a.startswith('x') else 'qb') for q, a, _ in items)


def test_a_position_bias_cancels():
  # A judge that adds +0.3 to whichever reply is shown first ranks the same.
  plain = _judge.JudgeReward(_FakeJudge(_longer))
  biased = _judge.JudgeReward(_FakeJudge(lambda a, b: 0.2 + 0.6 * _longer(a, b),
                                         position_bias=0.2))
  recs, resp = _group('a', 4), ['x', 'xxxx', 'xx', 'xxx']
  np.testing.assert_allclose(np.argsort(plain(recs, resp)),
                             np.argsort(biased(recs, resp)))
  always_a = _judge.JudgeReward(_FakeJudge(lambda a, b: 1.0))
  np.testing.assert_allclose(always_a(recs, resp), 0.5)


def test_reference_comparison_and_length_adjustment():
  fake = _FakeJudge(_longer)
  recs, resp = _group('a', 2), ['a much longer reply here', 'no']
  ref = _judge.JudgeReward(fake, compare='reference')
  np.testing.assert_allclose(ref(recs, resp), [1.0, 0.0])
  assert [b for _, _, b in fake.calls[0][:2]] == ['good a.', 'good a.']
  plain = _judge.JudgeReward(_FakeJudge(_longer))(recs, resp)
  adj = _judge.JudgeReward(_FakeJudge(_longer), length_penalty=0.5)(recs, resp)
  assert adj[0] < plain[0] and adj[1] > plain[1]
  with pytest.raises(ValueError, match='compare'):
    _judge.JudgeReward(fake, compare='pairs')
  with pytest.raises(ValueError, match='no reference reply'):
    _judge.JudgeReward(fake, compare='reference')(
        [dict(id='z', messages=[{'role': 'user', 'content': 'q'}])], ['r'])


def test_a_prompt_that_does_not_fit_is_an_error(quick_sft_run):
  from cascade_jax import train
  _, _, tok = train.restore_run(quick_sft_run)
  with pytest.raises(ValueError, match='does not fit seq_len=16'):
    _judge.encode_judgements(tok, [('q', 'a b c', 'd e f')], 16, 8)


def test_judge_stage_trains_and_serves_as_reward(quick_sft_run, tmp_path):
  from configs import judge as judge_config
  c = judge_config.get_config('quick')
  c.mesh = type(c.mesh)({})
  c.init_from = quick_sft_run
  c.steps = 12
  out = reward_model.judge_train_run(c, str(tmp_path / 'judge'))
  assert out == json.load(open(tmp_path / 'judge' / 'judge_scores.json'))
  assert out['n'] == out['before']['n'] == c.eval_n
  # Training teaches the verdict: before it the model answers neither A nor
  # B (measured: 'neither' 1.0, agreement 0.0), after 12 steps it answers A
  # or B (0.047 neither; agreement 0.48, near chance this early).
  assert out['before']['neither'] > 0.5 > out['neither'], out
  assert out['agreement'] > out['before']['agreement'], out
  # The run is a judge (and a plain language model for everything else).
  assert reward_model.is_judge(str(tmp_path / 'judge'))
  fn = reward_model.load(str(tmp_path / 'judge'),
                         judge=dict(compare='group', length_penalty=0.0))
  held = domains.generate('preference', split='eval', n=c.eval_n,
                          seed=c.seed, levels=tuple(c.data.levels))
  assert reward_model.judge_agreement(fn.judge, held) == {
      k: out[k] for k in ('agreement', 'both_orders', 'soft', 'position_bias',
                          'neither', 'n')}
  recs = [held[0]] * 3 + [held[1]] * 3
  resp = [held[0]['chosen'], held[0]['rejected'], 'x'] + [held[1]['chosen']] * 3
  r = fn(recs, resp)
  # Each reply's reward: its order-averaged win probability against each
  # other reply of its group, from the judge's P(first better) in both
  # orders; so a group's rewards sum to half its size, whatever the
  # position bias (measured 0.36 here: one order alone would not).
  q = _judge.question_of(held[0])
  p = {(i, j): fn.judge.p_first([(q, resp[i], resp[j])])[0][0]
       for i in range(3) for j in range(3) if i != j}
  want = [np.mean([0.5 * (p[(i, j)] + 1 - p[(j, i)])
                   for j in range(3) if j != i]) for i in range(3)]
  np.testing.assert_allclose(r[:3], want, atol=1e-5)
  np.testing.assert_allclose(r[:3].sum(), 1.5, atol=1e-5)
  np.testing.assert_allclose(r[3:], 0.5, atol=1e-6)   # identical replies tie
  # A score does not depend on the rest of the batch (no token dropped).
  np.testing.assert_allclose(fn(recs[:3], resp[:3]), r[:3], atol=1e-5)
  assert fn.last_dropped == 0.0


@pytest.mark.slow  # ~17 s, not the default (RLHF's reward is the Bradley-Terry RM): CI runs it
def test_rl_stage_learns_from_the_judge(quick_sft_run, tmp_path):
  # RLHF steps with the judge as their reward: on-policy, nothing dropped,
  # the reward a win rate, and the policy moved by it.
  from cascade_jax import rl
  from configs import judge as judge_config
  from configs import rl as rl_config
  jc = judge_config.get_config('quick')
  jc.mesh = type(jc.mesh)({})
  jc.init_from = quick_sft_run
  reward_model.judge_train_run(jc, str(tmp_path / 'judge'))
  c = rl_config.get_config('quick')
  c.mesh = type(c.mesh)({})
  c.init_from, c.reward_model = quick_sft_run, str(tmp_path / 'judge')
  c.data.domain, c.data.levels = 'preference', (1, 2, 3)
  c.rl.kl_coef, c.rl.dynamic_filtering, c.rl.overlong = 0.1, False, 'none'
  c.steps, c.eval_n = 2, 0
  rl.run(c, str(tmp_path / 'rlhf'))
  rows = [json.loads(l) for l in open(tmp_path / 'rlhf' / 'rl_metrics.jsonl')]
  steps = [r for r in rows if 'reward_mean' in r]
  assert len(steps) == 2
  for r in steps:
    assert r['sampler_mismatch_max'] <= 1e-5, r
    assert r['dropped_reward_model'] == 0.0
    # Win rates within a group: their mean is 0.5 whatever the judge says,
    # their spread is the judge ranking the replies.
    assert r['reward_mean'] == pytest.approx(0.5, abs=1e-5)
    assert r['reward_std'] > 0.0, r
  # The first update starts at the reference (KL 0); the judge's rewards
  # moved the policy, so the second step's samples are scored away from it.
  assert steps[0]['kl'] == pytest.approx(0.0, abs=1e-6)
  assert steps[1]['kl'] > 1e-7, steps[1]
