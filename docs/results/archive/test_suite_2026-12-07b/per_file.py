import re, sys, collections
tot = collections.Counter(); n = collections.Counter()
for l in open(sys.argv[1]):
  m = re.match(r'^([0-9.]+)s (call|setup|teardown)\s+(\S+?)::', l)
  if m:
    tot[m.group(3)] += float(m.group(1)); n[m.group(3)] += m.group(2) == 'call'
s = sum(tot.values())
print(f'total {s:.0f} worker-s in {len(tot)} files')
for f, t in tot.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 25):
  print(f'{t:7.1f} {n[f]:4d} {f}')
