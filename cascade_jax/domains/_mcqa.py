"""Multiple-choice answers (NeMo-Gym's mcqa rows, the public knowledge-MCQA RL set): the chosen letter, read as the reference server reads it.

A row has `options` (a list of one-entry objects, letter -> option text),
`expected_answer` (the gold letter), optionally `grading_mode` and
`template_metadata.output_regex` (a pattern or a list of them). The reward
is 1 when the letter read from the response is the gold one, else 0.

How a letter is read (written here from the server's documentation and
test cases; its own verify agrees on 4,000 generated cases,
docs/results/checks/verifier_agreement_2026-12-05):
- `template_metadata.output_regex`, when present, first: the patterns in
  order, case-insensitive, the last match of the first pattern that gives
  an answer; its capture (letters of other scripts mapped to A-D first) is
  the answer if it is one letter, even one outside the options (the regex
  is trusted), else the option whose text equals it. A pattern that does
  not compile gives nothing. Then, if nothing was read:
- `strict_single_letter_boxed` (the default): the last `\\boxed{...}` (its
  braces counted), `\\text{...}` wrappers removed; an upper-case letter
  alone with non-letter padding (`[C]`), or a leading letter and a label
  delimiter (`E: ...`, `C) ...`); it must be one of the options'.
- `lenient_boxed`: strict, else the one option whose text (lower-cased,
  whitespace collapsed) occurs in the last box.
- `lenient_answer_colon`: the first `Answer:` line's rest, wrappers removed:
  one letter of the options, or an option's text exactly.
- `lenient_answer_colon_md`: every `Answer:` line (markdown emphasis around
  the word or after the colon allowed), the last one first, until one
  gives a letter: the payload's outer punctuation and emphasis stripped;
  a list of different option letters (`A/B`, `A or B`, `A, B`) gives none;
  one character, else a leading letter not followed by a letter or digit,
  else the last stand-alone capital.
An empty response reads nothing.
"""

from __future__ import annotations

import re

GRADING_MODES = ('strict_single_letter_boxed', 'lenient_boxed',
                 'lenient_answer_colon', 'lenient_answer_colon_md')

# Letters of other scripts a model may answer in, as the options' A-D.
_SCRIPTS = str.maketrans({
    'أ': ' A', 'ب': ' B', 'ج': ' C', 'د': ' D',       # Arabic
    'অ': ' A', 'ব': ' B', 'ড': ' C', 'ঢ': ' D',       # Bengali
    'Ａ': ' A', 'Ｂ': ' B', 'Ｃ': ' C', 'Ｄ': ' D'})    # full width
_TEXT = re.compile(r'\\text\{\s*(.*?)\s*\}', re.S)
_BOX_LETTER = re.compile(r'[^A-Za-z]*([A-Z])[^A-Za-z]*')
_BOX_LABEL = re.compile(r'\s*([A-Z])\s*[:).\-]')
_ANSWER = re.compile(r'(?i)answer\s*:\s*(.+)')
_ANSWER_MD = re.compile(r'(?im)[*_]{0,2}Answer[*_]{0,2}\s*:[*_\s]{0,2}(.+)')
_LETTER = re.compile(r'(?<![A-Za-z])([A-Za-z])(?![A-Za-z])')
_LIST_SEP = re.compile(r'\s*[/|&,;]\s*|\s+(?:or|and)\s+|\s+', re.I)
_LEADING = re.compile(r'([a-zA-Z])(?![a-zA-Z0-9])')
_LAST_CAPITAL = re.compile(r'\b[A-Z]\b(?!.*\b[A-Z]\b)', re.S)


def letters(options) -> set[str]:
  """The options' letters (one-letter keys with a text)."""
  return {k.upper() for entry in options or () for k, v in entry.items()
          if isinstance(k, str) and len(k) == 1 and k.isalpha()
          and v is not None}


def _norm(s: str) -> str:
  return ' '.join(s.lower().split())


def _unwrap(s: str) -> str:
  """`s` without the `\\text{...}` wrappers around all of it."""
  while (m := _TEXT.fullmatch(s)) is not None:
    s = m.group(1)
  return s


def last_box(text: str) -> str | None:
  """What the last `\\boxed{` holds up to its closing brace, or None."""
  start = text.rfind('\\boxed{')
  if start < 0:
    return None
  depth, i = 1, start + len('\\boxed{')
  for j in range(i, len(text)):
    depth += {'{': 1, '}': -1}.get(text[j], 0)
    if depth == 0:
      return text[i:j]
  return None


def _option_equal(candidate: str, options, allowed) -> str | None:
  want = _norm(candidate)
  for entry in options or ():
    for k, v in entry.items():
      if v is not None and k.upper() in allowed and _norm(v) == want:
        return k.upper()
  return None


def _strict_boxed(text: str, allowed) -> str | None:
  inner = last_box(text)
  if inner is None:
    return None
  inner = _unwrap(inner.strip())
  m = _BOX_LETTER.fullmatch(inner) or _BOX_LABEL.match(inner)
  letter = m.group(1) if m else None
  return letter if letter in allowed else None


def _box_option_text(text: str, options, allowed) -> str | None:
  inner = last_box(text)
  if inner is None:
    return None
  inner = inner.strip()
  seen = {_norm(inner), _norm(_unwrap(inner))}
  found = {k.upper() for entry in options or () for k, v in entry.items()
           if v is not None and len(k) == 1 and k.upper() in allowed
           and _norm(v) and any(_norm(v) in s for s in seen)}
  return found.pop() if len(found) == 1 else None


def _answer_colon(text: str, options, allowed) -> str | None:
  m = _ANSWER.search(text)
  if m is None:
    return None
  candidate = _unwrap(m.group(1)).strip()
  if len(candidate) == 1 and candidate.isalpha() and (
      candidate.upper() in allowed):
    return candidate.upper()
  return _option_equal(candidate, options, allowed)


def _choice(payload: str, allowed) -> str | None:
  """One option letter from an `Answer:` payload, or None."""
  c = payload.translate(_SCRIPTS).strip().strip('*_` \t\n\r.,;:')
  found = [(m.group(1).upper(), m.span(1)) for m in _LETTER.finditer(c)
           if m.group(1).upper() in allowed]
  if any(a != b and _LIST_SEP.fullmatch(c[sa[1]:sb[0]])
         for (a, sa), (b, sb) in zip(found, found[1:])):
    return None          # several different options listed
  if len(c) == 1:
    letter = c
  elif (m := _LEADING.match(c)) is not None:
    letter = m.group(1)
  else:
    m = _LAST_CAPITAL.search(c)
    letter = m.group(0) if m else ''
  return letter.upper() if letter and letter.upper() in allowed else None


def _custom(text: str, patterns, options, allowed) -> str | None:
  for pattern in [patterns] if isinstance(patterns, str) else patterns:
    try:
      matches = re.findall(pattern, text, re.IGNORECASE)
    except re.error:
      continue
    if not matches:
      continue
    last = matches[-1]
    if isinstance(last, tuple):      # several groups: the first that matched
      last = next((g for g in last if g), '')
    captured = last.translate(_SCRIPTS).strip().upper()
    if len(captured) == 1 and captured.isalpha():
      return captured
    hit = _option_equal(captured, options, allowed)
    if hit is not None:
      return hit
  return None


def read_letter(text: str, options, *, grading_mode: str =
                'strict_single_letter_boxed', output_regex=None
                ) -> str | None:
  """The letter the response `text` chooses, or None (see the module)."""
  if grading_mode not in GRADING_MODES:
    raise ValueError(f'mcqa: grading_mode {grading_mode!r} not in '
                     f'{GRADING_MODES}')
  text = text.strip()
  if not text:
    return None
  allowed = letters(options)
  if output_regex:
    pred = _custom(text, output_regex, options, allowed)
    if pred is not None:
      return pred
  if grading_mode == 'lenient_answer_colon':
    return _answer_colon(text, options, allowed)
  if grading_mode == 'lenient_answer_colon_md':
    return next((p for p in map(lambda s: _choice(s, allowed),
                                reversed(_ANSWER_MD.findall(text)))
                 if p is not None), None)
  pred = _strict_boxed(text, allowed)
  if pred is None and grading_mode == 'lenient_boxed':
    pred = _box_option_text(text, options, allowed)
  return pred


def reward(fields: dict, response: str) -> tuple[float, dict]:
  """(1 or 0, {extracted_answer, expected_answer}) for a row's fields
  (options, expected_answer, grading_mode, output_regex)."""
  gold = str(fields['expected_answer']).strip().upper()
  pred = read_letter(response, fields['options'],
                     grading_mode=fields.get('grading_mode') or GRADING_MODES[0],
                     output_regex=fields.get('output_regex'))
  return float(pred is not None and pred == gold), dict(
      extracted_answer=pred, expected_answer=gold)
