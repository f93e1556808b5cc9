"""The instruction checkers of IFEval, IFBench and IF-RLVR, run offline.

IFEval's 25 instructions and IFBench's 58 are the `if-verifiable`
package's; IF-RLVR's 29 training instructions (the public RL set uses them)
are written here from their published definitions (`_if_rlvr`). A
few need nltk data (punkt, punkt_tab, stopwords, a POS tagger) that no
package on the index carries and that cannot be downloaded at run time
here. Where the data is installed (`nltk.download` done beforehand, or
NLTK_DATA) the reference path runs unchanged; where it is not:

- sentence splitting (IFEval `length_constraints:number_sentences`, IFBench
  sentence counts) uses nltk's Punkt algorithm untrained instead of its
  English model: the same splits but for abbreviations the model knows
  ("Dr. Smith" is two sentences untrained);
- word tokenising (`nltk.word_tokenize`: IFEval
  `change_case:capital_word_frequency`, IFBench `format:title_case`,
  `words:words_position`, `words:keywords_specific_position`, and IF-RLVR's
  `_if_rlvr.TOKENISED`) uses nltk's own word tokenizer over those
  sentences: the same tokens but where the sentence split differs;
- `ratio:stop_words` (stopword list) and `words:start_verb` (POS tagger)
  cannot run (`UNAVAILABLE`): a data set's rows that need them are set
  aside with that reason, and `NLTK_DATA` names what installs them.

`DIFFERS` names the instructions on a fallback. The IFBench module's own
attempt to download its data at import is turned off (no network).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence

from cascade_jax.domains import _if_rlvr

# Instruction id -> why it cannot run here (filled by `registry`).
UNAVAILABLE: dict[str, str] = {}
# Instruction id -> the nltk data it needs that is not always installed:
# `python -m nltk.downloader <names>` installs them.
NLTK_DATA = {'ratio:stop_words': 'stopwords',
             'words:start_verb': 'averaged_perceptron_tagger_eng'}
# Instruction id -> how it differs from the reference here.
DIFFERS: dict[str, str] = {}

_SENTENCES = ('length_constraints:number_sentences',)
_WORDS = ('change_case:capital_word_frequency', 'format:title_case',
          'words:words_position', 'words:keywords_specific_position',
          *_if_rlvr.TOKENISED)


def _has(nltk, resource: str) -> bool:
  try:
    nltk.data.find(resource)
    return True
  except LookupError:
    return False


@functools.cache
def registry() -> dict[str, type]:
  """Instruction id -> checker class: IFEval's, IFBench's and IF-RLVR's."""
  import nltk  # pylint: disable=g-import-not-at-top
  download = nltk.download
  nltk.download = lambda *a, **k: False     # never the network at run time
  try:
    # pylint: disable=g-import-not-at-top
    from if_verifiable.ifbench import instructions as ifbench_instructions
    from if_verifiable.ifbench import instructions_registry as ifbench
    from if_verifiable.ifbench import instructions_util as ifbench_util
    from if_verifiable.ifeval import instructions as ifeval_instructions
    from if_verifiable.ifeval import instructions_registry as ifeval
    from if_verifiable.ifeval import instructions_util as ifeval_util
    # pylint: enable=g-import-not-at-top
  finally:
    nltk.download = download
  from nltk.tokenize import NLTKWordTokenizer  # pylint: disable=g-import-not-at-top
  from nltk.tokenize.punkt import PunktSentenceTokenizer  # pylint: disable=g-import-not-at-top
  if not _has(nltk, 'tokenizers/punkt/english.pickle'):
    untrained = PunktSentenceTokenizer()
    for util in (ifeval_util, ifbench_util):
      util._get_sentence_tokenizer = lambda: untrained  # pylint: disable=protected-access
    for i in _SENTENCES:
      DIFFERS[i] = 'sentences split by untrained Punkt (no punkt data)'
  if not _has(nltk, 'tokenizers/punkt_tab/english/'):
    words = NLTKWordTokenizer()

    def word_tokenize(text, language='english', preserve_line=False):
      del language
      sents = [text] if preserve_line else PunktSentenceTokenizer().tokenize(
          text)
      return [t for s in sents for t in words.tokenize(s)]

    # The checkers' modules see an nltk whose word_tokenize needs no data;
    # nltk itself is left as it is.
    offline = types.SimpleNamespace(**{k: getattr(nltk, k) for k in dir(nltk)
                                       if not k.startswith('__')})
    offline.word_tokenize = word_tokenize
    for mod in (ifeval_util, ifbench_util, ifbench_instructions,
                ifeval_instructions):
      if hasattr(mod, 'nltk'):
        mod.nltk = offline
    for i in _WORDS:
      DIFFERS.setdefault(i, 'words tokenised after an untrained Punkt split '
                         '(no punkt_tab data)')
  if not _has(nltk, 'corpora/stopwords'):
    UNAVAILABLE['ratio:stop_words'] = 'needs nltk stopwords (not installed)'
  if not _has(nltk, 'taggers/averaged_perceptron_tagger_eng'):
    UNAVAILABLE['words:start_verb'] = 'needs nltk POS tagger (not installed)'
  rlvr = {i: _if_rlvr.Checker for i in _if_rlvr.CHECKS}
  rlvr.update({i: ifeval.INSTRUCTION_DICT[j]
               for i, j in _if_rlvr.ALIASES.items()})
  return {**ifbench.INSTRUCTION_DICT, **ifeval.INSTRUCTION_DICT, **rlvr}


def unknown_ids(ids: Sequence[str],
                kwargs: Sequence[dict] | None = None) -> dict[str, str]:
  """The ids among `ids` that cannot be checked here, with why; given the
  row's `kwargs`, also those whose checker refuses its kwargs."""
  reg = registry()
  bad = {i: UNAVAILABLE.get(i, 'not in the IFEval, IFBench or IF-RLVR '
                            'registry')
         for i in ids if i not in reg or i in UNAVAILABLE}
  for iid, kw in zip(ids, kwargs or (), strict=False):
    if iid not in bad:
      try:
        _build(reg, iid, kw, '')
      except (ValueError, TypeError, KeyError) as e:
        bad[iid] = f'bad kwargs: {type(e).__name__}: {e}'[:300]
  return bad


def _build(reg: dict, iid: str, kw: dict | None, prompt: str):
  """A checker built from its kwargs (nulls dropped) and, where it takes
  one, the prompt."""
  checker = reg[iid](iid)
  checker.build_description(**{k: v for k, v in (kw or {}).items()
                               if v is not None})
  args = checker.get_instruction_args()
  if args and 'prompt' in args:
    checker.build_description(prompt=prompt)
  return checker


def _checkers(ids: Sequence[str], kwargs: Sequence[dict], prompt: str):
  reg = registry()
  bad = unknown_ids(ids)
  if bad:
    raise KeyError(f'instructions that cannot be checked here: {bad}')
  return [_build(reg, iid, kw, prompt)
          for iid, kw in zip(ids, kwargs, strict=True)]


def follows(ids: Sequence[str], kwargs: Sequence[dict], prompt: str,
            response: str) -> list[bool]:
  """Strict verdicts, one an instruction (IFEval's strict mode); an empty
  response follows nothing."""
  return [bool(response.strip()) and bool(c.check_following(response))
          for c in _checkers(ids, kwargs, prompt)]


def loose_variants(response: str) -> list[str]:
  """IFEval's loose mode: the response, without its first line, without its
  last, without both, each also with every '*' removed."""
  lines = response.split('\n')
  cuts = [response, '\n'.join(lines[1:]).strip(),
          '\n'.join(lines[:-1]).strip(), '\n'.join(lines[1:-1]).strip()]
  return cuts + [c.replace('*', '') for c in cuts]


def follows_loose(ids: Sequence[str], kwargs: Sequence[dict], prompt: str,
                  response: str) -> list[bool]:
  """Loose verdicts: an instruction is followed when any non-empty loose
  variant of the response follows it (each checker built once)."""
  variants = [v for v in loose_variants(response) if v.strip()]
  return [any(bool(c.check_following(v)) for v in variants)
          for c in _checkers(ids, kwargs, prompt)]
