# Helper of gpu/whatif_truth.sh (needs no torch: a snapshot pickle is plain dicts and lists).
#   oomed-nolimit DIR          tags of unlimited runs that OOMed or wrote nothing (to rerun alone)
#   limits DIR WORKLOAD...     "WORKLOAD NAME BYTES" lines: the memory limits to run under
#   table DIR                  the markdown table on stdout; DIR/truth.json with every run's figures
import sys, os, json, gzip, pickle, glob

MiB, GiB = 1024**2, 1024**3
cmd, d = sys.argv[1], sys.argv[2]


def runs():
    out = {}
    for p in sorted(glob.glob(f"{d}/*_s*_*.json")):
        m = json.load(open(p)); out[m["tag"]] = m
    return out


def up2m(x):
    return -(-int(x) // (2 * MiB)) * (2 * MiB)


def requests(tag):
    """The request stream: ('a', size) per alloc, ('f', index of the alloc) per free_requested."""
    snap = pickle.load(gzip.open(f"{d}/{tag}.pickle.gz"))
    tr = [t for t in snap["device_traces"] if t][0] if any(snap["device_traces"]) else []
    live, ops = {}, []
    for e in tr:
        if e["action"] == "alloc":
            live[e["addr"]] = len(ops); ops.append(("a", e["size"]))
        elif e["action"] == "free_requested":
            ops.append(("f", live.pop(e["addr"], -1)))
    return ops


if cmd == "oomed-nolimit":
    for w in ("train", "kvcache", "frag"):
        for i in range(8):
            t = f"{w}_s{i}_nolimit"
            p = f"{d}/{t}.json"
            if os.path.exists(f"{d}/{t}.log") and (not os.path.exists(p) or json.load(open(p))["oomed"]):
                print(t)
elif cmd == "limits":
    rs = runs()
    for w in sys.argv[3:]:
        if w == "frag":  # fixed by construction: 10.3 GiB live at the 2.5 GiB request
            for g in (12, 11, 10):
                print(w, f"lim{g}g", g * GiB)
            continue
        un = [m for t, m in rs.items() if t.startswith(w + "_") and t.endswith("_nolimit") and not m["oomed"]]
        if not un:
            continue
        pa = max(m["stats"]["allocated_bytes.all.peak"] for m in un)
        pr0 = next((m["stats"]["reserved_bytes.all.peak"] for m in un if m["tag"] == f"{w}_s0_nolimit"), pa)
        tight = up2m(pa * 1.04)
        mid = up2m((pa + pr0) / 2)
        if mid < tight + 256 * MiB:
            mid = up2m(pa * 1.15)
        print(w, "tight", tight); print(w, "mid", mid)
elif cmd == "table":
    rs = runs()
    base = {}
    rows = []
    print("# whatif ground truth\n")
    print(open(f"{d}/device.txt").read().strip(), "·", next(iter(rs.values()))["torch"] if rs else "", "\n")
    print("| run | alloc_conf | limit (allowed bytes) | oom | first failing request (trace `oom` size / observer alloc) | peak reserved | peak allocated | retries | device alloc / free | events | requests vs. baseline | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t, m in rs.items():
        w = m["workload"]
        if w not in base:
            base[w] = requests(f"{w}_s0_nolimit") if os.path.exists(f"{d}/{w}_s0_nolimit.pickle.gz") else None
        ops = requests(t)
        b = base[w]
        if b is None:
            same = "no baseline"
        else:
            n = min(len(ops), len(b))
            diff = next((i for i in range(n) if ops[i] != b[i]), None)
            if diff is not None:
                same = f"differs at request {diff}: {ops[diff]} vs {b[diff]}"
            elif len(ops) == len(b):
                same = "same"
            else:
                same = f"prefix ({len(ops)} of {len(b)})"
        st = m["stats"]; o = m.get("oom") or {}
        te = (o.get("trace_entry") or {}); ob = (o.get("observer") or [{}])
        ob = ob[0] if ob else {}
        fail = f"{te.get('size')} / {ob.get('alloc')}" if m["oomed"] else ""
        row = {"tag": t, "workload": w, "alloc_conf": m["alloc_conf"], "allowed": m["allowed"],
               "device_total": m["device_total"], "fraction": m["fraction"], "oom": m["oomed"],
               "oom_trace_entry": te or None, "oom_observer": ob or None, "oom_message": o.get("message"),
               "peak_reserved": st.get("reserved_bytes.all.peak"), "peak_allocated": st.get("allocated_bytes.all.peak"),
               "reserved": st.get("reserved_bytes.all.current"), "allocated": st.get("allocated_bytes.all.current"),
               "inactive_split": st.get("inactive_split_bytes.all.current"),
               "num_alloc_retries": st.get("num_alloc_retries"), "num_device_alloc": st.get("num_device_alloc"),
               "num_device_free": st.get("num_device_free"), "num_ooms": st.get("num_ooms"),
               "events": m["events"], "requests": len(ops), "requests_vs_baseline": same,
               "allocator_settings": m.get("allocator_settings")}
        rows.append(row)
        print(f"| {t} | `{m['alloc_conf']}` | {m['allowed'] if m['allowed'] is not None else 'none'} | "
              f"{'OOM' if m['oomed'] else 'no'} | {fail} | {row['peak_reserved']:,} | {row['peak_allocated']:,} | "
              f"{row['num_alloc_retries']} | {row['num_device_alloc']} / {row['num_device_free']} | {m['events']} | {same} | {m['seconds']} |")
    json.dump(rows, open(f"{d}/truth.json", "w"), indent=1, default=str)
    missing = [l for l in open(f"{d}/runs.txt") if " rc 0" not in l and not l.startswith("seconds")]
    print("\nruns without rc 0:", "".join(missing) or "none")
