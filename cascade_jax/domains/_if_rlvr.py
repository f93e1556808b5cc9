"""The IF-RLVR training instructions (open-instruct's IFEvalG), written here from their published definitions.

The public RL set's instruction-following rows use, beside IFEval's and
IFBench's ids, the 29 that AllenAI's IF-RLVR added for training
(`allenai/open-instruct`, `open_instruct/IFEvalG/instructions.py`; no
package on the index carries them). Each checker here decides what the
reference decides, quirks included, since those verdicts are the reward the
public data was made for:

- words are whitespace tokens unless the reference tokenises with nltk
  (`count:counting_composition`, `count:count_unique`,
  `keywords:keyword_specific_position`, `keywords:start_end`: nltk's
  `word_tokenize`, punctuation a token of its own, through the same offline
  fallback as IFEval's checkers, see `_if_registry`);
- sentences are IFEval's regex splitter (`split_into_sentences`, the same
  function in both);
- keyword counts are case-insensitive substring counts (`word` in
  `swordfish` counts), as the reference's `re.findall(keyword, ...)`, the
  keyword taken literally (the reference passes it to `re` unescaped; for a
  keyword of letters the two agree, for one with `+` or `(` the reference
  raises);
- `copy:repeat_phrase`: exactly `small_n` spans from the phrase's first word
  to its last word, each of the phrase's length and at most one word
  changed, the last exactly one (the reference checks the last span's
  count only);
- `new:copy_span_idx`: the slice `prompt_to_repeat[n_start:n_end]` (the
  instruction says "including n_end"; the reference's slice does not);
- `letters:letter_counting2` is IFEval's `keywords:letter_frequency`.

A checker whose kwargs miss a value the instruction needs raises, naming
the instruction and the kwarg (the reference would draw a random one).
"""

from __future__ import annotations

import re
from collections.abc import Callable

_RELATIONS = ('less than', 'at least')


def _sentences(text: str) -> list[str]:
  from if_verifiable.ifeval import instructions_util  # pylint: disable=g-import-not-at-top
  return instructions_util.split_into_sentences(text)


def _tokens(text: str) -> list[str]:
  # The checkers' nltk (the offline fallback where punkt_tab is missing,
  # installed by `_if_registry.registry()`, which runs first).
  from if_verifiable.ifeval import instructions_util  # pylint: disable=g-import-not-at-top
  return instructions_util.nltk.word_tokenize(text)


def _count(keyword: str, text: str) -> int:
  return len(re.findall(re.escape(keyword), text, flags=re.IGNORECASE))


def _first(word) -> str:
  # first_word / last_word / keyword may come as a one-item list.
  return (word if isinstance(word, str) else word[0]).strip()


def _compare(n: int, relation: str, threshold: int) -> bool:
  if relation not in _RELATIONS:
    raise ValueError(f'relation must be one of {_RELATIONS}, not {relation!r}')
  return n < threshold if relation == 'less than' else n >= threshold


def _pieces(text: str, separator: str) -> list[str] | None:
  """`text` split at `separator`; empty pieces dropped at either end, None
  when one is empty in the middle (the reference's paragraph rule)."""
  parts = re.split(separator, text)
  keep = []
  for i, p in enumerate(parts):
    if p.strip():
      keep.append(p)
    elif 0 < i < len(parts) - 1:
      return None
  return keep


def _repeat_phrase(value, *, phrase, small_n):
  ref = phrase.strip().split()
  found = re.findall(rf'{re.escape(ref[0])} .*? {re.escape(ref[-1])}', value)
  if len(found) != small_n:
    return False
  changed = 0
  for span in found:
    words = span.split()
    if len(words) != len(ref):
      return False
    changed = sum(a != b for a, b in zip(words, ref))
    if changed > 1:
      return False
  return changed == 1


def _same(a: str, b: str) -> bool:
  return a.strip().lower() == b.strip().lower()


def _copied(value, *, prompt_to_repeat):
  return _same(value, prompt_to_repeat)


def _sentence_hyphens(value):
  gold = _sentences(value.replace('-', ' '))
  return all(s.strip() == s and s == g
             for s, g in zip(value.split('-'), gold))


def _no_adjacent_consecutive(value):
  heads = [w[0].lower() for w in value.split()]
  return all(len(a) == 1 and len(b) == 1 and ord(b) - ord(a) != 1
             for a, b in zip(heads, heads[1:]))


def _first_word_sent(value, *, first_word):
  want = _first(first_word).lower()
  return all(s.strip() and s.split()[0].lower() == want
             for s in _sentences(value))


def _last_word(sentence: str) -> str:
  return re.sub(r'[^\w\s]', '', sentence.split()[-1]).lower()


def _last_word_sent(value, *, last_word):
  want = _first(last_word).lower()
  return all(s.strip() and _last_word(s) == want for s in _sentences(value))


def _bigram_wrapping(value):
  w = value.split()
  return all(w[i].startswith('<<') and w[i + 1].endswith('>>')
             for i in range(0, len(w) - 1, 2))


def _copying_multiple(value, *, prompt_to_repeat, N):  # pylint: disable=invalid-name
  copies = value.split('******')
  return len(copies) == N and all(_same(c, prompt_to_repeat) for c in copies)


def _counting_composition(value, *, n_sent, n_words):
  # Every piece between '***' dividers, the empty ones at either end
  # included (the reference counts their sentences too, so a divider at
  # the start or end fails), has n_sent sentences of n_words tokens.
  parts = re.split(r'\s?\*\*\*\s?', value)
  for i, p in enumerate(parts):
    if not p.strip() and 0 < i < len(parts) - 1:
      return False
    sentences = _sentences(p)
    if len(sentences) != n_sent or any(len(_tokens(s)) != n_words
                                       for s in sentences):
      return False
  return len([p for p in parts if p.strip()]) == 3


def _keyword_specific_position(value, *, keyword, n, m):
  sentences = _sentences(value)
  if len(sentences) < n:
    return False
  words = _tokens(sentences[n - 1])
  return len(words) >= m and words[m - 1] == _first(keyword)


def _start_end(value):
  words = _tokens(value)
  return len(words) >= 2 and words[0].lower() == words[-1].lower()


# id -> (check(value, **kwargs), the kwargs it needs).
CHECKS: dict[str, tuple[Callable[..., bool], tuple[str, ...]]] = {
    'copy:repeat_phrase': (_repeat_phrase, ('phrase', 'small_n')),
    'copy:copy': (_copied, ('prompt_to_repeat',)),
    'new:copy_span_idx': (
        lambda v, *, prompt_to_repeat, n_start, n_end: _same(
            v, prompt_to_repeat[n_start:n_end]),
        ('prompt_to_repeat', 'n_start', 'n_end')),
    'detectable_format:sentence_hyphens': (_sentence_hyphens, ()),
    'keywords:no_adjacent_consecutive': (_no_adjacent_consecutive, ()),
    'detectable_format:square_brackets': (
        lambda v: all(w.startswith('[') and w.endswith(']')
                      for w in v.split()), ()),
    'keywords:word_once': (lambda v, *, keyword: _count(keyword.strip(), v)
                           == 1, ('keyword',)),
    'keywords:word_count_different_numbers': (
        lambda v, *, keyword, frequency, relation: _compare(
            _count(keyword.strip(), v), relation, frequency),
        ('keyword', 'frequency', 'relation')),
    'keywords:exclude_word_harder': (
        lambda v, *, keyword: f' {keyword.strip()} ' not in v, ('keyword',)),
    'paragraphs:paragraphs': (
        lambda v: (p := _pieces(v, r'\s?\*\*\*\s?')) is not None
        and len(p) == 2, ()),
    'paragraphs:paragraphs2': (
        lambda v: (p := _pieces(v, r'\n\n')) is not None and len(p) == 2, ()),
    'first_word:first_word_sent': (_first_word_sent, ('first_word',)),
    'first_word:first_word_answer': (
        lambda v, *, first_word: bool(v.split()) and v.split()[0].lower()
        == _first(first_word).lower(), ('first_word',)),
    'last_word:last_word_sent': (_last_word_sent, ('last_word',)),
    'last_word:last_word_answer': (
        lambda v, *, last_word: bool(v.split()) and _last_word(v)
        == _first(last_word).lower(), ('last_word',)),
    'detectable_format:bigram_wrapping': (_bigram_wrapping, ()),
    'copy:copying_simple': (_copied, ('prompt_to_repeat',)),
    'copy:copying_multiple': (_copying_multiple, ('prompt_to_repeat', 'N')),
    'punctuation:punctuation_dot': (lambda v: '.' not in v, ()),
    'punctuation:punctuation_exclamation': (lambda v: '!' not in v, ()),
    'count:lowercase_counting': (
        lambda v, *, N: len(re.findall(r'\b[a-z]+\b', v)) <= N, ('N',)),
    'letters:letter_counting': (
        lambda v, *, N, relation: _compare(len(re.findall(r'[a-zA-Z]', v)),
                                           relation, N), ('N', 'relation')),
    'count:counting_composition': (_counting_composition,
                                   ('n_sent', 'n_words')),
    'count:count_unique': (
        lambda v: len(t := _tokens(v)) == len(set(t)), ()),
    'count:count_increment_word': (
        lambda v, *, keyword1, keyword2: _count(keyword1.strip(), v) == 1
        and _count(keyword2.strip(), v) == 2, ('keyword1', 'keyword2')),
    'keywords:palindrome': (
        lambda v: any(w == w[::-1] for w in v.split()), ()),
    'keywords:keyword_specific_position': (_keyword_specific_position,
                                           ('keyword', 'n', 'm')),
    'keywords:start_end': (_start_end, ()),
}
# Checked by nltk's word tokenizer (on the offline fallback without its data).
TOKENISED = ('count:counting_composition', 'count:count_unique',
             'keywords:keyword_specific_position', 'keywords:start_end')
# An IF-RLVR id that is an IFEval checker under another name.
ALIASES = {'letters:letter_counting2': 'keywords:letter_frequency'}


class Checker:
  """One IF-RLVR instruction, with the interface of the packages' checkers
  (`build_description(**kwargs)`, `get_instruction_args()`,
  `check_following(response)`)."""

  def __init__(self, instruction_id: str):
    self.id = instruction_id
    self._check, self._needs = CHECKS[instruction_id]
    self._kwargs: dict = {}

  def build_description(self, **kwargs) -> str:
    missing = [k for k in self._needs if kwargs.get(k) in (None, '', [])]
    if missing:
      raise ValueError(f'{self.id}: kwargs lack {missing} (given: '
                       f'{sorted(kwargs)})')
    if 'relation' in self._needs and kwargs['relation'] not in _RELATIONS:
      raise ValueError(f"{self.id}: relation must be one of {_RELATIONS}, "
                       f"not {kwargs['relation']!r}")
    self._kwargs = {k: kwargs[k] for k in self._needs}
    return self.id

  def get_instruction_args(self) -> dict:
    return dict(self._kwargs)

  def check_following(self, value: str) -> bool:
    return bool(self._check(value, **self._kwargs))
