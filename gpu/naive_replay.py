#!/usr/bin/env python3
"""An independent replay of a gpufrag record's PyTorch blocks, for diagnosis: decodes the record
(docs: src/record.rs, version 3: 16-byte header, 80-byte events, texts in 80-byte records after
their event), rebuilds one process's segments and blocks with PyTorch's own rules (round_size with
roundup_power2_divisions, should_split: small pool remaining >= 512, large pool remaining > 1 MiB,
free neighbours merged inside a segment), and prints its live blocks' total. With a second record
of the same process (a `gpufrag run` one, whose tracker gives each block's real size), prints the
blocks live in one and not the other.

usage: naive_replay.py RECORD PID [DIVISIONS] [--against RECORD2]
"""
import struct, sys

MIB = 1 << 20


def read(path):
    d = open(path, "rb").read()
    assert d[:8] == b"GPUFRAG\x01", f"{path}: not a gpufrag record"
    off, out = 16, []
    while off + 80 <= len(d):
        f = struct.unpack_from("<7Q2IHhiIHH", d, off)
        ev = dict(zip("ts addr size req handle stream dfree pid tid kind dev rc flags op tlen".split(), f))
        off += 80 + 80 * ((ev["tlen"] + 79) // 80)
        out.append(ev)
    return out


def round_size(n, div):
    if n < 512:
        return 512
    if div > 1 and n > 512 * div:
        if n & (n - 1) == 0:
            return n
        floor = 1 << (n.bit_length() - 1)
        step = floor >> (div.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = n & ~(step - 1)
        return n if low == n else low + step
    return 512 * ((n + 511) // 512)


def replay(path, pid, div):
    """Live blocks {addr: size} after the record, PyTorch's rules; known sizes taken as given."""
    segs, live = {}, {}
    for e in read(path):
        if e["pid"] != pid:
            continue
        k, a = e["kind"], e["addr"]
        if k == 1:  # MemAlloc: a segment, one free block
            segs[a] = [e["size"], {a: [e["size"], False]}]
        elif k == 4:
            segs.pop(a, None)
        elif k in (14, 15):
            s = next((st for st in segs if st <= a < st + segs[st][0]), None)
            if s is None:
                continue
            size_of_seg, blocks = segs[s]
            if k == 14:
                if a not in blocks:  # inside a free block: split it at a
                    start = max(b for b in blocks if b < a)
                    blocks[a] = [blocks[start][0] - (a - start), False]
                    blocks[start][0] = a - start
                free = blocks[a][0]
                r = e["size"] if e["flags"] & 32 else round_size(e["req"], div)
                rem = free - r
                if rem > 0 and (e["flags"] & 32 or (rem >= 512 if size_of_seg == 2 * MIB else rem > MIB)):
                    blocks[a] = [r, True]
                    blocks[a + r] = [rem, False]
                else:
                    blocks[a] = [free, True]
                live[a] = blocks[a][0]
            elif a in blocks:
                live.pop(a, None)
                blocks[a][1] = False
                keys = sorted(blocks)
                i = keys.index(a)
                if i + 1 < len(keys) and not blocks[keys[i + 1]][1]:
                    blocks[a][0] += blocks.pop(keys[i + 1])[0]
                if i > 0 and not blocks[keys[i - 1]][1]:
                    blocks[keys[i - 1]][0] += blocks.pop(a)[0]
    return live


if __name__ == "__main__":
    args = sys.argv[1:]
    other = None
    if "--against" in args:
        i = args.index("--against")
        other = args[i + 1]
        del args[i : i + 2]
    path, pid = args[0], int(args[1])
    div = int(args[2]) if len(args) > 2 else 1
    live = replay(path, pid, div)
    print(f"{path}: {len(live)} live blocks, {sum(live.values()):,} B")
    if other:
        theirs = replay(other, pid, div)
        print(f"{other}: {len(theirs)} live blocks, {sum(theirs.values()):,} B")
        only = {a: s for a, s in theirs.items() if a not in live}
        print(f"live only in {other}: {len(only)} blocks, {sum(only.values()):,} B")
        only = {a: s for a, s in live.items() if a not in theirs}
        print(f"live only in {path}: {len(only)} blocks, {sum(only.values()):,} B")
        diff = [(a, s, theirs[a]) for a, s in live.items() if a in theirs and theirs[a] != s]
        print(f"sized differently: {len(diff)} blocks")
