import json, sys
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
diffs=[]; same=0; psame=0
for sa, sb in zip(a['stages'], b['stages']):
    assert sa['name']==sb['name']
    for d in sa['scores']:
        x, y = sa['scores'][d], sb['scores'][d]
        diffs.append((round(y['pass_rate']-x['pass_rate'],4), sa['name'], d, round(x['pass_rate'],3), round(y['pass_rate'],3)))
        same += x['pass_rate']==y['pass_rate']; psame += x.get('prompt_pass')==y.get('prompt_pass')
print('cells', len(diffs), 'equal', same, 'prompt-for-prompt equal', psame)
print('largest |diff|', max(diffs, key=lambda t: abs(t[0])), 'mean diff', round(sum(t[0] for t in diffs)/len(diffs),4))
first = next((t for t in diffs if t[0] != 0), None); print('first differing', first)
