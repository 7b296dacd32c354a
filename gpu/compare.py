# Compares gpufrag's summary JSON with what PyTorch reported (TAG.torch.json): one table row per figure.
import json, sys
s = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2])); tag = sys.argv[3]
procs = [p for p in s["processes"] if p["reserved"] > 0]
p = max(procs, key=lambda p: p["reserved"]) if procs else {}
rows = [("reserved", t.get("reserved"), p.get("reserved")), ("allocated", t.get("allocated"), p.get("allocated")),
        ("stranded (inactive_split)", t.get("inactive_split_bytes"), p.get("stranded")),
        ("segments (snapshot entries)", t.get("snapshot_segments"), p.get("segments")),
        ("largest free block", t.get("largest_free_block"), p.get("largest_free_block"))]
for name, want, got in rows:
    if want is None:
        continue
    print(f"| {tag} | {name} | {want:,} | {got:,} | {'equal' if want == got else 'DIFFERS by %+d' % (got - want)} |")
print(f"| {tag} | level / exact | {t.get('backend')} | {p.get('level')} / {s['exact']} | |")
