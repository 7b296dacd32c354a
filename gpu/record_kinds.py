# Counts the event kinds in a gpufrag record file (80-byte records after a 16-byte header).
import struct, sys, collections
KINDS = ["?", "mem_alloc", "mem_alloc_pitch", "mem_alloc_managed", "mem_free", "address_reserve", "address_free",
         "phys_create", "phys_release", "map", "unmap", "pool_alloc", "pool_free", "pool_trim", "block_alloc",
         "block_free", "alloc_failed", "device_info", "process_exec", "process_exit", "dropped", "pool_reserved", "adopt"]
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"GPUFRAG\x01", "not a record file"
c = collections.Counter(); sizes = collections.Counter()
for off in range(16, len(data) - 79, 80):
    ts, addr, size, req, handle, stream, free, pid, tid, kind, dev, rc, flags, op, _ = struct.unpack_from("<7QIIHhiIHH", data, off)
    name = KINDS[kind] if kind < len(KINDS) else str(kind)
    c[name] += 1; sizes[name] += size
print(" ".join(f"{k}={v}" for k, v in sorted(c.items())), "| bytes:", " ".join(f"{k}={v}" for k, v in sorted(sizes.items()) if v))
