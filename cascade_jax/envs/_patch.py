"""Strict one-file unified diffs: context and removed lines must match the source."""

from __future__ import annotations

import re


class PatchError(ValueError):
  """A diff that does not apply to the source."""


_HUNK = re.compile(r'^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@')


def apply_unified_diff(src: str, diff: str) -> str:
  """Applies a one-file unified diff strictly: context and removals must match."""
  lines = src.splitlines()
  out: list[str] = []
  pos = 0
  hunks = 0
  dl = diff.splitlines()
  i = 0
  while i < len(dl):
    m = _HUNK.match(dl[i])
    i += 1
    if not m:
      continue
    hunks += 1
    start = int(m.group(1)) - 1 if int(m.group(2) or 1) else int(m.group(1))
    if start < pos:
      raise PatchError('hunks overlap or are out of order')
    out.extend(lines[pos:start])
    pos = start
    while i < len(dl) and not dl[i].startswith('@@'):
      ln = dl[i]
      i += 1
      if ln.startswith('\\'):  # "\ No newline at end of file"
        continue
      tag, text = (ln[:1], ln[1:]) if ln else (' ', '')
      if tag in (' ', '-'):
        if pos >= len(lines) or lines[pos] != text:
          raise PatchError(f'line {pos + 1} does not match: expected '
                           f'{text!r}, found '
                           f'{lines[pos] if pos < len(lines) else "EOF"!r}')
        pos += 1
        if tag == ' ':
          out.append(text)
      elif tag == '+':
        out.append(text)
      else:
        raise PatchError(f'bad diff line {ln!r}')
  if not hunks:
    raise PatchError('no @@ hunk found')
  out.extend(lines[pos:])
  return '\n'.join(out) + '\n'
