import json, sys
def load(p):
    out = []
    for l in open(p):
        r = json.loads(l)
        out.append({k: v for k, v in r.items() if not (k.startswith("perf/") or k.endswith("_per_s") or "idle" in k)})
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sum(x == y for x, y in zip(a, b))
print(f"{same} of {max(len(a), len(b))} records identical (len {len(a)} vs {len(b)})")
for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
        d = {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)}
        print(i, list(d.items())[:6])
