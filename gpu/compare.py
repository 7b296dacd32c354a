# Compares gpufrag's summary JSON with what PyTorch reported (TAG.torch.json): one table row per figure.
import json, sys
s = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2])); tag = sys.argv[3]
procs = [p for p in s["processes"] if p["reserved"] > 0]
if "pid" in t and any(p["pid"] == t["pid"] for p in procs):  # the workload's own process (an agent sees many)
    procs = [p for p in procs if p["pid"] == t["pid"]]
p = max(procs, key=lambda p: p["reserved"]) if procs else {}
rows = [("reserved (held by the cache)", t.get("reserved"), p.get("framework_reserved")), ("allocated", t.get("allocated"), p.get("allocated")),
        ("stranded (inactive_split)", t.get("inactive_split_bytes"), p.get("stranded")),
        ("segments (snapshot entries)", t.get("snapshot_segments"), p.get("framework_segments")),
        ("largest free block", t.get("largest_free_block"), p.get("largest_free_block"))]
for name, want, got in rows:
    if want is None or got is None:
        continue
    print(f"| {tag} | {name} | {want:,} | {got:,} | {'equal' if want == got else 'DIFFERS by %+d' % (got - want)} |")
print(f"| {tag} | outside the cache (driver, not PyTorch) | | {p.get('non_framework', 0):,} in {p.get('segments', 0)} segments total | |")
print(f"| {tag} | level / exact | {t.get('backend')} | {p.get('level')} / {s['exact']} | |")
