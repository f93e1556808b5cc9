"""The IF-RLVR training instructions: each checker on replies whose verdict follows from its published definition."""

import os

import pytest

from cascade_jax.domains import _if_registry
from cascade_jax.domains import _if_rlvr
from cascade_jax.domains import nemo_gym

ROWS = os.path.join(os.path.dirname(__file__), 'data', 'nemo_gym',
                    'if_rlvr.jsonl')

PHRASE = dict(phrase='The early bird catches the worm', small_n=2)
PROMPT = dict(prompt_to_repeat='Write a haiku about rain.')
TEA = dict(keyword='tea')
COMPOSITION = dict(n_sent=1, n_words=3)

# (id, kwargs, reply, verdict). Cases marked "reference" decide as the
# published code does where its docstring would say otherwise.
CASES = [
    ('copy:repeat_phrase', PHRASE,
     'The early cat catches the worm. Then The early bird eats the worm.',
     True),
    ('copy:repeat_phrase', PHRASE,
     'The early cat catches the worm and The early bird catches the worm',
     False),                         # the last span unchanged
    ('copy:repeat_phrase', PHRASE,   # reference: only the last must change
     'The early bird catches the worm; The early bird eats the worm', True),
    ('copy:repeat_phrase', PHRASE, 'The early cat catches the worm.', False),
    ('copy:repeat_phrase', PHRASE,
     'The early cat catches a big worm and The early bird eats the worm',
     False),                         # a span of another length
    ('copy:copy', PROMPT, '  write a HAIKU about rain.  ', True),
    ('copy:copy', PROMPT, 'Write a haiku about rain. Sure!', False),
    ('new:copy_span_idx', dict(prompt_to_repeat='The quick brown fox',
                               n_start=4, n_end=9), 'Quick', True),
    ('new:copy_span_idx', dict(prompt_to_repeat='The quick brown fox',
                               n_start=4, n_end=9), 'quick b', False),
    ('detectable_format:sentence_hyphens', {},
     'I like tea.-It is warm.-Cheers!', True),
    ('detectable_format:sentence_hyphens', {},
     'I like tea. - It is warm.', False),
    ('keywords:no_adjacent_consecutive', {}, 'apple cherry banana', True),
    ('keywords:no_adjacent_consecutive', {}, 'apple Banana split', False),
    ('detectable_format:square_brackets', {}, '[Hello] [world]', True),
    ('detectable_format:square_brackets', {}, '[Hello] world', False),
    ('keywords:word_once', TEA, 'I drink tea daily.', True),
    ('keywords:word_once', TEA, 'Tea, and more tea.', False),
    ('keywords:word_once', TEA, 'Coffee.', False),
    ('keywords:word_once', TEA, 'I like steam.', True),   # reference: substring
    ('keywords:word_count_different_numbers',
     dict(TEA, frequency=2, relation='at least'), 'tea or TEA', True),
    ('keywords:word_count_different_numbers',
     dict(TEA, frequency=2, relation='at least'), 'tea', False),
    ('keywords:word_count_different_numbers',
     dict(TEA, frequency=2, relation='less than'), 'tea', True),
    ('keywords:exclude_word_harder', TEA, 'I like tea.', True),  # reference
    ('keywords:exclude_word_harder', TEA, 'I like tea a lot', False),
    ('paragraphs:paragraphs', {}, 'One.\n***\nTwo.', True),
    ('paragraphs:paragraphs', {}, '***\nOne.\n***\nTwo.\n***', True),
    ('paragraphs:paragraphs', {}, 'One.\n***\n***\nTwo.', False),
    ('paragraphs:paragraphs', {}, 'One.', False),
    ('paragraphs:paragraphs2', {}, 'One.\n\nTwo.', True),
    ('paragraphs:paragraphs2', {}, 'One.\n\n\n\nTwo.', False),
    ('paragraphs:paragraphs2', {}, 'One.\nTwo.', False),
    ('first_word:first_word_sent', dict(first_word='Yes'),
     'Yes I am. yes you are!', True),
    ('first_word:first_word_sent', dict(first_word=['Yes']),
     'Yes I am. No.', False),
    ('first_word:first_word_answer', dict(first_word='hello'),
     'Hello there. Bye.', True),
    ('first_word:first_word_answer', dict(first_word='hello'),
     'Hello, there', False),
    ('last_word:last_word_sent', dict(last_word='now'),
     'Come here now. Do it NOW!', True),
    ('last_word:last_word_sent', dict(last_word='now'),
     'Come now. Do it later.', False),
    ('last_word:last_word_answer', dict(last_word='end'),
     'This is the end.', True),
    ('last_word:last_word_answer', dict(last_word='end'),
     'The end is near.', False),
    ('detectable_format:bigram_wrapping', {}, '<<I am>> <<at home>>', True),
    ('detectable_format:bigram_wrapping', {}, '<<I am>> at home', False),
    ('copy:copying_simple', PROMPT, 'Write a haiku about rain.', True),
    ('copy:copying_simple', PROMPT, 'Rain falls softly.', False),
    ('copy:copying_multiple', dict(PROMPT, N=2),
     'Write a haiku about rain. ****** write a haiku about rain.', True),
    ('copy:copying_multiple', dict(PROMPT, N=3),
     'Write a haiku about rain.******Write a haiku about rain.', False),
    ('copy:copying_multiple', dict(PROMPT, N=2),
     'Write a haiku about rain.******Write a poem about rain.', False),
    ('punctuation:punctuation_dot', {}, 'No dots here', True),
    ('punctuation:punctuation_dot', {}, 'A dot.', False),
    ('punctuation:punctuation_exclamation', {}, 'Calm.', True),
    ('punctuation:punctuation_exclamation', {}, 'Wow!', False),
    ('count:lowercase_counting', dict(N=2), 'Hello World and me', True),
    ('count:lowercase_counting', dict(N=2), 'Hello and me too', False),
    ('letters:letter_counting', dict(N=5, relation='less than'), 'Hi 42',
     True),
    ('letters:letter_counting', dict(N=5, relation='less than'), 'Hello',
     False),
    ('letters:letter_counting', dict(N=5, relation='at least'), 'Hello',
     True),
    ('letters:letter_counting2',
     dict(letter='a', let_frequency=2, let_relation='at least'), 'banana',
     True),
    ('letters:letter_counting2',
     dict(letter='a', let_frequency=2, let_relation='at least'), 'bin',
     False),
    ('count:counting_composition', COMPOSITION,
     'I am here\n***\nYou are there\n***\nWe go now', True),
    ('count:counting_composition', COMPOSITION,   # '.' is a token
     'I am here.\n***\nYou are there.\n***\nWe go now.', False),
    ('count:counting_composition', COMPOSITION,
     'I am here\n***\nYou are there', False),
    ('count:counting_composition', COMPOSITION,   # reference: end divider
     'I am here\n***\nYou are there\n***\nWe go now\n***', False),
    ('count:count_unique', {}, 'one two three', True),
    ('count:count_unique', {}, 'one two one', False),
    ('count:count_unique', {}, 'a, b, c', False),  # ',' twice
    ('count:count_increment_word', dict(keyword1='cat', keyword2='dog'),
     'cat dog DOG', True),
    ('count:count_increment_word', dict(keyword1='cat', keyword2='dog'),
     'cat cat dog dog', False),
    ('keywords:palindrome', {}, 'wow that is nice', True),
    ('keywords:palindrome', {}, 'hello there', False),
    ('keywords:keyword_specific_position', dict(keyword='blue', n=2, m=3),
     'The sky. It is blue today.', True),
    ('keywords:keyword_specific_position', dict(keyword='blue', n=2, m=3),
     'The sky. Blue it is.', False),
    ('keywords:keyword_specific_position', dict(keyword='blue', n=3, m=1),
     'The sky. It is blue.', False),
    ('keywords:start_end', {}, 'Hello world hello', True),
    ('keywords:start_end', {}, 'Hello world, hello.', False),  # '.' last
    ('keywords:start_end', {}, 'Hello world', False),
]


def test_every_if_rlvr_id_is_checked_and_has_cases():
  ids = set(_if_rlvr.CHECKS) | set(_if_rlvr.ALIASES)
  assert len(ids) == 29
  assert not _if_registry.unknown_ids(sorted(ids))
  for iid in ids:
    verdicts = {want for i, _, _, want in CASES if i == iid}
    assert verdicts == {True, False}, iid


@pytest.mark.parametrize('iid,kwargs,reply,want', CASES)
def test_if_rlvr_checker(iid, kwargs, reply, want):
  assert _if_registry.follows([iid], [kwargs], 'a prompt', reply) == [want]


def test_kwargs_a_checker_needs_are_refused_by_name():
  bad = _if_registry.unknown_ids(
      ['count:lowercase_counting', 'letters:letter_counting',
       'punctuation:punctuation_dot'],
      [{'N': None}, {'N': 3, 'relation': 'about'}, {}])
  assert set(bad) == {'count:lowercase_counting', 'letters:letter_counting'}
  assert "lack ['N']" in bad['count:lowercase_counting']
  assert "'about'" in bad['letters:letter_counting']


def test_if_rlvr_rows_verify_as_nemo_gym_writes_them():
  # Rows in the public RL set's layout (kwargs with the reference's null
  # keys), rewarded by grading mode.
  # Row 1: two lowercase words ('and', 'kiwi') within 3, but an '!'
  # (fraction: 0.5); row 2 a verbatim copy; row 3: 'blue' is the 3rd token
  # of the 2nd sentence after the think block, but no 'z' (all: 0).
  got = nemo_gym.verify_rows(nemo_gym.read_rows(ROWS))
  assert [g['follow_instruction_list'] for g in got] == [
      [True, False], [True], [True, False]]
  assert [g['reward'] for g in got] == [0.5, 1.0, 0.0]
  assert [g['id'] for g in got] == [1, 2, 3]
