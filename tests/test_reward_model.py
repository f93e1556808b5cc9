"""The Bradley-Terry reward model: encoding, padding invariance, learning pairs, clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from cascade_jax import data
from cascade_jax import losses
from cascade_jax import model
from cascade_jax import reward_model

from _jit import call


@pytest.fixture(scope='module')
def tok():
  return data.train_tokenizer(['cats are soft and quiet.', 'rain is wet.',
                               'stupid question.', 'tell me about cats'] * 20,
                              160)


def _recs(n):
  return [dict(id=str(i), domain='preference',
               messages=[{'role': 'user', 'content': 'tell me about cats'}])
          for i in range(n)]


def test_pairs_are_right_padded_and_end_at_im_end(tok):
  t, last = reward_model.encode_pairs(tok, _recs(2), ['cats are soft.', 'x'],
                                      seq_len=32)
  for row, i in zip(t, last):
    assert row[i] == tok.im_end and (row[i + 1:] == tok.pad_id).all()


def test_scores_do_not_depend_on_padding(tok):
  rm = reward_model.RewardModel(
      model.Transformer(model.tiny(vocab_size=tok.vocab_size),
                        rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
  t, last = reward_model.encode_pairs(tok, _recs(2), ['cats are soft.', 'x'],
                                      seq_len=32)
  both = call(rm, jnp.asarray(t), jnp.asarray(last))
  alone = call(rm, jnp.asarray(t[:1, :last[0] + 1]), jnp.asarray(last[:1]))
  np.testing.assert_allclose(both[0], alone[0], atol=1e-5)


def test_exact_scores_do_not_depend_on_the_batch(tok):
  # The main job's model (capacity dispatch) with a skewed expert bias: in
  # a batch of 40 responses its configured path drops tokens, so a score
  # would depend on the other responses. Scoring runs exact.
  backbone = model.Transformer(model.small(vocab_size=tok.vocab_size),
                               rngs=nnx.Rngs(0))
  backbone.set_expert_biases(np.stack([
      np.random.RandomState(i).uniform(-0.1, 0.1, 8)
      for i in range(backbone.cfg.pattern.count('E'))]))
  rm = reward_model.RewardModel(backbone, rngs=nnx.Rngs(1))
  words = ['cats are soft and quiet.', 'rain is wet.', 'stupid question.']
  resp = [' '.join(words[(i + j) % 3] for j in range(1 + i % 4))
          for i in range(40)]
  t, last = map(jnp.asarray, reward_model.encode_pairs(tok, _recs(40), resp,
                                                       seq_len=48))
  s_all, info = call(rm, t, last, exact=True, with_info=True)
  assert float(info['router']['dropped'].max()) == 0.0
  alone = call(rm, t[:1], last[:1], exact=True)
  np.testing.assert_allclose(s_all[0], alone[0], atol=1e-5)
  _, info = call(rm, t, last, with_info=True)      # the configured path
  assert float(info['router']['dropped'].max()) > 0


@pytest.mark.slow  # ~28 s: CI runs it; the quick cascade test trains and scores the RM stage
def test_learns_to_prefer_the_chosen_response(tok):
  rm = reward_model.RewardModel(
      model.Transformer(model.tiny(vocab_size=tok.vocab_size),
                        rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
  recs = _recs(8)
  t, last = reward_model.encode_pairs(
      tok, recs + recs, ['cats are soft and quiet.'] * 8 +
      ['stupid question.'] * 8, seq_len=32)
  graph, params, rest = nnx.split(rm, nnx.Param, ...)
  opt = optax.adam(3e-3)
  opt_state = opt.init(params)

  def loss_fn(p):
    s = nnx.merge(graph, p, rest)(jnp.asarray(t), jnp.asarray(last))
    return losses.bradley_terry_loss(s[:8], s[8:])

  accs = []
  for _ in range(30):
    (_, m), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = opt.update(g, opt_state)
    params = optax.apply_updates(params, updates)
    accs.append(float(m['accuracy']))
  assert accs[-1] == 1.0


def test_missing_reward_model_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='reward model: no checkpoint'):
    reward_model.load(str(tmp_path / 'nope'))


def test_cross_prompt_negatives_pair_answers_to_other_questions(tok):
  from cascade_jax.reward_model import _model
  recs = [dict(r, topic=t, chosen=f'{t} ok.', rejected='bad.')
          for r, t in zip(_recs(3), ['cats', 'cats', 'rain'])]
  b = _model._pair_batch(tok, recs, 32, cross_prompt=True)
  assert b['tokens'].shape[0] == 12          # 3 pairs + 3 cross pairs, x2
  decoded = [tok.decode([x for x in row if x not in (tok.pad_id,)])
             for row in b['tokens']]
  # Negatives of the cross pairs: an answer about another topic.
  assert 'rain ok.' in decoded[9] and 'cats ok.' in decoded[11]
