/* gpufrag_annotate.h: the framework annotation API.
 *
 * A caching allocator that gpufrag cannot see into (its blocks live in its own code) can say what
 * it does through these functions. The LD_PRELOAD shim (libgpufrag_preload.so) exports them; a
 * program looks them up at run time with dlsym(RTLD_DEFAULT, "gpufrag_annotate_block_alloc") and
 * calls them only when found, so it runs unchanged without gpufrag. They never block and never
 * fail; each costs one push into the process's event ring.
 *
 * PyTorch needs none of this (gpufrag reads its blocks through its snapshot API or USDT probes);
 * simcuda-workload's own caching allocator uses it.
 */
#ifndef GPUFRAG_ANNOTATE_H
#define GPUFRAG_ANNOTATE_H
#include <stdint.h>

/* The allocator owns the segment (or mapped range) holding addr: its free space is cache. */
void gpufrag_annotate_segment(uint64_t addr, int device);
/* A block [addr, addr + size) was handed out for a request of `requested` bytes. */
void gpufrag_annotate_block_alloc(uint64_t addr, uint64_t size, uint64_t requested, int device);
/* The block at addr went back to the cache. */
void gpufrag_annotate_block_free(uint64_t addr, int device);
/* A request of `requested` bytes failed for good (after the allocator's own retries);
 * device_free is what the device had free then, or UINT64_MAX when unknown. */
void gpufrag_annotate_oom(uint64_t requested, uint64_t device_free, int device);

#endif
