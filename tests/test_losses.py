"""GRPO / MOPD losses: numbers by hand, REINFORCE at ratio 1, masking, convergence."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cascade_jax import losses
from cascade_jax.losses import _reward
from cascade_jax.losses import _rl


@pytest.mark.parametrize('module', [_rl, _reward])
def test_docstring_examples_run(module):
  result = doctest.testmod(module, extraglobs={'jnp': jnp})
  assert result.attempted > 0 and result.failed == 0


def test_bradley_terry_gradient_pushes_the_pair_apart():
  g = jax.grad(lambda c, r: losses.bradley_terry_loss(c, r)[0],
               argnums=(0, 1))(jnp.array([0.5]), jnp.array([0.5]))
  # At a tie, d/dr_c = -sigmoid(0) = -0.5 (raise chosen), d/dr_r = +0.5.
  np.testing.assert_allclose([g[0][0], g[1][0]], [-0.5, 0.5], atol=1e-6)


@pytest.mark.parametrize('scale, loo, want', [
    # rewards [1, 0, 0, 0]: mean .25, std sqrt(3)/4 = .4330.
    ('none', False, [0.75, -0.25, -0.25, -0.25]),
    ('std', False, [0.75 / 0.4330127, -0.25 / 0.4330127,
                    -0.25 / 0.4330127, -0.25 / 0.4330127]),
    # leave-one-out baselines: [0, 1/3, 1/3, 1/3].
    ('none', True, [1.0, -1 / 3, -1 / 3, -1 / 3]),
])
def test_group_advantages_by_hand(scale, loo, want):
  r = jnp.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
  got = losses.group_advantages(r, 4, scale=scale, leave_one_out=loo)
  np.testing.assert_allclose(got[:4], want, rtol=1e-4)
  np.testing.assert_allclose(got[4:], 0.0, atol=1e-6)  # equal rewards: no signal


def test_group_advantages_errors():
  with pytest.raises(ValueError, match='multiple of group_size'):
    losses.group_advantages(jnp.ones(5), 4)
  with pytest.raises(ValueError, match='scale'):
    losses.group_advantages(jnp.ones(4), 4, scale='max')


def test_grpo_by_hand_token_vs_sequence_normalisation():
  # Two rollouts: lengths 1 and 3, advantages +1 and -1, logp = -1 everywhere.
  # At ratio 1 the per-token loss is -A: token-level = (-1 + 3) / 4 = 0.5;
  # sequence-level = mean(-1, +1) = 0.
  logp = -jnp.ones((2, 3))
  mask = jnp.array([[1, 0, 0], [1, 1, 1]])
  adv = jnp.array([1.0, -1.0])
  tok, m = losses.grpo_loss(logp, adv, mask)
  seq, _ = losses.grpo_loss(logp, adv, mask, normalize='sequence')
  assert float(tok) == pytest.approx(0.5)
  assert float(seq) == pytest.approx(0.0)
  assert float(m['loss_sum']) == pytest.approx(2.0)
  assert float(m['token_count']) == 4.0


def test_grpo_gradient_at_ratio_one_is_reinforce():
  # d/dlogp of the surrogate = -A mask / N: the REINFORCE estimate.
  rng = np.random.RandomState(0)
  logp = jnp.asarray(-rng.rand(3, 5))
  mask = jnp.asarray(rng.randint(0, 2, (3, 5)))
  adv = jnp.asarray(rng.randn(3))
  g = jax.grad(lambda lp: losses.grpo_loss(lp, adv, mask)[0])(logp)
  want = -adv[:, None] * mask / mask.sum()
  np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7)


def test_grpo_masking_equals_slicing():
  rng = np.random.RandomState(1)
  logp = jnp.asarray(-rng.rand(2, 6))
  old = logp + 0.3 * jnp.asarray(rng.randn(2, 6))
  adv = jnp.array([0.7, -1.2])
  mask = jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
  a, _ = losses.grpo_loss(logp, adv, mask, old_logp=old)
  b, _ = losses.grpo_loss(logp[:, :3], adv, jnp.ones((2, 3)),
                          old_logp=old[:, :3])
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_grpo_clipping_stops_the_gradient_and_is_counted():
  # ratio e^0.5 = 1.65 > 1 + 0.28 with A > 0: clipped, zero gradient.
  logp = jnp.array([[0.0, 0.0]])
  old = jnp.array([[-0.5, 0.0]])
  loss_fn = lambda lp: losses.grpo_loss(lp, jnp.array([1.0]), jnp.ones((1, 2)),
                                        old_logp=old, clip_eps_high=0.28)
  g = jax.grad(lambda lp: loss_fn(lp)[0])(logp)
  assert float(g[0, 0]) == 0.0 and float(g[0, 1]) != 0.0
  assert float(loss_fn(logp)[1]['clip_fraction']) == pytest.approx(0.5)


def test_grpo_k3_kl_by_hand():
  # ref - logp = d = log 2: k3 = 2 - log 2 - 1 = 0.3069; beta .03.
  logp = jnp.log(jnp.array([[0.25]]))
  ref = jnp.log(jnp.array([[0.5]]))
  loss, m = losses.grpo_loss(logp, jnp.array([0.0]), jnp.ones((1, 1)),
                             ref_logp=ref, kl_coef=0.03)
  assert float(m['kl']) == pytest.approx(1 - np.log(2), rel=1e-5)
  assert float(loss) == pytest.approx(0.03 * (1 - np.log(2)), rel=1e-5)


def test_grpo_truncated_importance_weight():
  logp = jnp.log(jnp.array([[0.5]]))
  sampler = jnp.log(jnp.array([[0.1]]))   # pi_old / pi_sampler = 5
  loss, _ = losses.grpo_loss(logp, jnp.array([1.0]), jnp.ones((1, 1)),
                             sampler_logp=sampler, tis_cap=2.0)
  assert float(loss) == pytest.approx(-2.0, rel=1e-6)


def test_grpo_masks_tokens_past_the_sampler_ratio_bound():
  # Ratios pi_old / pi_sampler 5, 1.25, 0.2 with bound 2: the first and the
  # last are dropped (w 0), the middle weighs 1; the gradient follows.
  logp = jnp.log(jnp.array([[0.5, 0.5, 0.1]]))
  sampler = jnp.log(jnp.array([[0.1, 0.4, 0.5]]))
  f = lambda x: losses.grpo_loss(x, jnp.array([1.0]), jnp.ones((1, 3)),
                                 sampler_logp=sampler, tis_cap=2.0,
                                 sampler_mask=True)
  loss, m = f(logp)
  assert float(loss) == pytest.approx(-1.0 / 3, rel=1e-6)
  assert float(m['is_cut_fraction']) == pytest.approx(2 / 3)
  assert float(m['is_weight_mean']) == pytest.approx(1 / 3)
  g = jax.grad(lambda x: f(x)[0])(logp)
  assert float(g[0, 0]) == 0.0 and float(g[0, 2]) == 0.0
  assert float(g[0, 1]) == pytest.approx(-1.0 / 3, rel=1e-6)
  # Truncation instead: weights 2, 1.25, 0.2 (one token cut).
  _, m = losses.grpo_loss(logp, jnp.array([1.0]), jnp.ones((1, 3)),
                          sampler_logp=sampler, tis_cap=2.0)
  assert float(m['is_weight_mean']) == pytest.approx((2 + 1.25 + 0.2) / 3,
                                                     rel=1e-6)
  assert float(m['is_cut_fraction']) == pytest.approx(1 / 3)


def test_mopd_by_hand():
  # Tokens with pi_train .5 / .5, teacher .25 / 1.0, sampler = train (w = 1):
  # a = [log .5, log 2]; loss = -mean(a * logp) = -(log.5 log.5 + log2 log.5)/2 = 0.
  lp = jnp.log(jnp.array([[0.5, 0.5]]))
  teacher = jnp.log(jnp.array([[0.25, 1.0]]))
  loss, m = losses.mopd_loss(lp, teacher, lp, jnp.ones((1, 2)))
  assert float(loss) == pytest.approx(0.0, abs=1e-7)
  # The gradient is -w a / |V|: pushes the first token down, the second up.
  g = jax.grad(lambda x: losses.mopd_loss(x, teacher, lp, jnp.ones((1, 2)))[0])(lp)
  np.testing.assert_allclose(g, [[-np.log(.5) / 2, -np.log(2) / 2]], rtol=1e-6)
  assert float(m['weight_mean']) == 1.0


def test_mopd_truncates_mismatched_tokens():
  lp = jnp.log(jnp.array([[0.5, 0.5]]))
  sampler = jnp.log(jnp.array([[0.1, 0.5]]))   # ratio 5: outside [.5, 2]
  _, m = losses.mopd_loss(lp, lp - 1.0, sampler, jnp.ones((1, 2)))
  assert float(m['truncated_fraction']) == pytest.approx(0.5)
  assert float(m['weight_mean']) == pytest.approx(0.5)


def test_mopd_on_own_samples_drives_reverse_kl_to_zero():
  # A categorical policy over 6 tokens learns a fixed teacher from its own
  # samples only; the exact reverse KL must fall close to zero.
  teacher = jax.nn.log_softmax(jnp.array([2.0, 1.0, 0.0, -1.0, 0.5, -2.0]))
  theta = jnp.zeros(6)

  def rkl(th):
    p = jax.nn.log_softmax(th)
    return float(jnp.sum(jnp.exp(p) * (p - teacher)))

  @jax.jit
  def step(th, key):
    sample_logp = jax.nn.log_softmax(th)
    y = jax.random.categorical(key, sample_logp, shape=(256,))

    def loss(th):
      lp = jax.nn.log_softmax(th)[y][:, None]          # 256 one-token samples
      return losses.mopd_loss(lp, teacher[y][:, None], sample_logp[y][:, None],
                              jnp.ones((256, 1)))[0]
    return th - 0.5 * jax.grad(loss)(th)

  start = rkl(theta)
  key = jax.random.key(0)
  for _ in range(300):
    key, sub = jax.random.split(key)
    theta = step(theta, sub)
  assert start > 0.5
  assert rkl(theta) < 0.02 * start
