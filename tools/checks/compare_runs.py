#!/usr/bin/env python3
"""Are two reproductions the same? Compares two working directories in which
`acpo reproduce all --scale SCALE` ran (their results/SCALE, figures/SCALE and models/), byte
for byte, timings aside: metrics lines lose timing_s/* and perf/*; provenance.json loses its
times, commit and hardware; init.json its created_utc; SHA256SUMS files (which hash the timed
files) are skipped. Exit 0 when nothing differs.

    python3 tools/checks/compare_runs.py BASE_DIR NEW_DIR mini
"""
import sys, os, json, hashlib
if len(sys.argv) != 4:
    sys.exit(__doc__)
a, b, scale = sys.argv[1], sys.argv[2], sys.argv[3]
def files(root):
    out = {}
    for sub in [f"results/{scale}", f"figures/{scale}", "models"]:
        base = os.path.join(root, sub)
        for dp, dn, fn in os.walk(base):
            for f in fn:
                if f.endswith('.lock'):  # acpo's locks: empty, not results
                    continue
                p = os.path.join(dp, f)
                out[os.path.relpath(p, root)] = p
    return out
def norm(rel, p):
    data = open(p, 'rb').read()
    name = os.path.basename(rel)
    if name == 'SHA256SUMS': return None
    if name == 'metrics.jsonl':
        lines = []
        for l in data.decode().splitlines():
            d = json.loads(l)
            d = {k: v for k, v in d.items() if not (k.startswith('timing_s/') or k.startswith('perf/'))}
            lines.append(json.dumps(d, sort_keys=True))
        return '\n'.join(lines).encode()
    if name == 'provenance.json':
        d = json.loads(data)
        for k in ['started_unix','started_utc','finished_unix','finished_utc','git_commit','hardware']: d.pop(k, None)
        return json.dumps(d, sort_keys=True).encode()
    if name == 'init.json':
        d = json.loads(data); d.pop('created_utc', None)
        if isinstance(d.get('warm_start'), dict): d['warm_start'].pop('seconds', None)
        return json.dumps(d, sort_keys=True).encode()
    return data
fa, fb = files(a), files(b)
only_a = sorted(set(fa) - set(fb)); only_b = sorted(set(fb) - set(fa))
same = differ = 0; diffs = []
for rel in sorted(set(fa) & set(fb)):
    x, y = norm(rel, fa[rel]), norm(rel, fb[rel])
    if x is None: continue
    if x == y: same += 1
    else: differ += 1; diffs.append(rel)
print(f"{scale}: {same} identical, {differ} differ, {len(only_a)} only in {a}, {len(only_b)} only in {b}")
for d in diffs[:30]: print("  differs:", d)
for d in only_a[:20]: print("  only base:", d)
for d in only_b[:20]: print("  only new:", d)
sys.exit(0 if differ == 0 and not only_a and not only_b else 1)
