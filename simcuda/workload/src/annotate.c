/* annotate.c: simcuda-workload's caching allocator announces its blocks through
 * include/gpufrag_annotate.h, the header a C or C++ allocator would include: USDT probes for the
 * eBPF path, the shim's functions for `gpufrag run`. Rust calls these four wrappers. */
#include "gpufrag_annotate.h"

void simcuda_announce_segment(uint64_t addr, int device)
{
	gpufrag_announce_segment(addr, device);
}

void simcuda_announce_block_alloc(uint64_t addr, uint64_t size, uint64_t requested, int device)
{
	gpufrag_announce_block_alloc(addr, size, requested, device);
}

void simcuda_announce_block_free(uint64_t addr, int device)
{
	gpufrag_announce_block_free(addr, device);
}

void simcuda_announce_oom(uint64_t requested, uint64_t device_free, int device)
{
	gpufrag_announce_oom(requested, device_free, device);
}
