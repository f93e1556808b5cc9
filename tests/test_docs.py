"""The docs a reader meets: a short README, links that resolve, no issue numbers, the results index."""

import os
import re
import subprocess

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)\)')
_ISSUE = re.compile(r'\bissues? ?#?\d+', re.IGNORECASE)


def _tracked(*patterns):
  out = subprocess.run(['git', '-C', _ROOT, 'ls-files', '--cached', '--others',
                        '--exclude-standard', *patterns],
                       capture_output=True, text=True, check=True).stdout
  return [p for p in out.split() if os.path.exists(os.path.join(_ROOT, p))]


def _anchor(heading: str) -> str:
  """GitHub's anchor for a markdown heading."""
  a = re.sub(r'[^\w\- ]', '', heading.strip().lower())
  return a.replace(' ', '-')


def broken_links(path: str) -> list[str]:
  """The relative links of a markdown file that resolve to nothing (a file,
  a folder, or a heading of a markdown file)."""
  with open(os.path.join(_ROOT, path)) as f:
    text = f.read()
  text = re.sub(r'```.*?```', '', text, flags=re.S)     # code is not links
  bad = []
  for target in _LINK.findall(text):
    if re.match(r'[a-z]+:', target):                    # https:, mailto:
      continue
    file, _, anchor = target.partition('#')
    full = os.path.normpath(os.path.join(_ROOT, os.path.dirname(path), file))
    if file and not os.path.exists(full):
      bad.append(f'{path}: {target}')
    elif anchor:
      md = full if file else os.path.join(_ROOT, path)
      if md.endswith('.md'):
        with open(md) as f:
          heads = {_anchor(h) for h in re.findall(r'^#+ (.*)$', f.read(),
                                                  re.M)}
        if anchor not in heads:
          bad.append(f'{path}: {target} (no such heading)')
  return bad


def test_the_readme_is_a_front_page():
  with open(os.path.join(_ROOT, 'README.md')) as f:
    lines = f.read().splitlines()
  assert len(lines) <= 200, len(lines)


def test_every_link_in_the_readme_and_docs_resolves():
  bad = [b for p in _tracked('README.md', '*.md') for b in broken_links(p)]
  assert not bad, '\n'.join(bad)


def test_a_broken_link_is_found(tmp_path, monkeypatch):
  monkeypatch.setattr(__import__(__name__), '_ROOT', str(tmp_path))
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'docs' / 'a.md').write_text('# Top\n[ok](a.md#top) [x](b.md) '
                                          '[y](a.md#nope)\n')
  assert broken_links('docs/a.md') == ['docs/a.md: b.md',
                                       'docs/a.md: a.md#nope (no such heading)']


@pytest.mark.parametrize('kind', ['docs', 'code'])
def test_no_issue_numbers_in_docs_or_comments(kind):
  # Issues are the team's, not the repository's readers': a doc, a README
  # or a comment says what is, not which ticket asked for it. (Other
  # projects' issues, owner/repo#N, are references, and pass.)
  pats = (['*.md', '*.ipynb'] if kind == 'docs' else
          ['*.py', '*.sh', '*.cc', '*.h', '*.toml', '*.ini', '*.cfg'])
  bad = []
  for p in _tracked(*pats):
    with open(os.path.join(_ROOT, p), errors='replace') as f:
      for i, line in enumerate(f, 1):
        for m in _ISSUE.finditer(line):
          if '#' in m.group(0) and re.search(r'[\w-]+/[\w.-]+#\d+',
                                             line[max(0, m.start() - 60):
                                                  m.end()]):
            continue
          bad.append(f'{p}:{i}: {line.strip()[:100]}')
  assert not bad, '\n'.join(bad[:30])


def test_the_results_index_and_the_readmes_figures():
  from experiments import results_index  # pylint: disable=g-import-not-at-top
  assert results_index.problems() == []
  doc, want = results_index.readme_with()
  assert doc == want, ('README.md: its figures are not the index\'s: run '
                       'python -m experiments.results_index --write')
