/* torch_trace.h: one PyTorch allocator trace entry turned into gpufrag's annotation calls.
 *
 * PyTorch's CUDA caching allocator calls its trace trackers
 * (c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker) under its own lock for every
 * trace entry, with history recording on or off. torch_tracker.cpp receives them and hands each
 * one's plain values to gpufrag_trace_entry below, which makes at most one call into the
 * LD_PRELOAD shim (libgpufrag_preload.so, include/gpufrag_annotate.h). Plain C and plain values,
 * so that CI (no PyTorch) compiles and drives exactly this translation.
 *
 * What each action carries (c10/cuda/CUDACachingAllocator.cpp, record_trace call sites) and what
 * gpufrag makes of it:
 *   ALLOC           addr_ = block->ptr, size_ = the requested size (orig_size), stream_ = the
 *                   block's stream: BlockAlloc{addr, requested, stream} with the size left to
 *                   gpufrag's copy of the allocator's rounding and split rules (src/alloc/pytorch.rs),
 *                   as for the USDT probe pytorch:malloc.
 *   FREE_REQUESTED  the program freed the block; allocated_bytes drops here, but a block used on
 *                   other streams (record_stream) is only reusable once its events complete:
 *                   nothing (the block stays in the map until FREE_COMPLETED).
 *   FREE_COMPLETED  free_block(): the block goes back on the free lists: BlockFree{addr}.
 *                   Without stream uses it follows FREE_REQUESTED at once, in the same call.
 *   SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP: nothing; the shim's driver hooks
 *                   see cudaMalloc / cudaFree / cuMemMap / cuMemUnmap themselves, in order.
 *   SNAPSHOT        nothing.
 *   OOM             the request failed for good: addr_ = device free (cudaMemGetInfo), size_ =
 *                   the rounded request: AllocFailed{requested = size_, device_free = addr_}.
 */
#ifndef GPUFRAG_TORCH_TRACE_H
#define GPUFRAG_TORCH_TRACE_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* TraceEntry::Action's values (c10/core/CachingDeviceAllocator.h; torch_tracker.cpp checks
 * them against the installed header at compile time). */
enum gpufrag_trace_action {
	GPUFRAG_TE_ALLOC = 0,
	GPUFRAG_TE_FREE_REQUESTED = 1,
	GPUFRAG_TE_FREE_COMPLETED = 2,
	GPUFRAG_TE_SEGMENT_ALLOC = 3,
	GPUFRAG_TE_SEGMENT_FREE = 4,
	GPUFRAG_TE_SEGMENT_MAP = 5,
	GPUFRAG_TE_SEGMENT_UNMAP = 6,
	GPUFRAG_TE_SNAPSHOT = 7,
	GPUFRAG_TE_OOM = 8
};

/* The shim's exports the translation calls (looked up once with dlsym). */
struct gpufrag_shim_calls {
	void (*block_alloc_on_stream)(uint64_t addr, uint64_t size, uint64_t requested, int device, uint64_t stream);
	void (*block_free)(uint64_t addr, int device);
	void (*oom)(uint64_t requested, uint64_t device_free, int device);
};

/* One trace entry: returns 1 when it made a call into the shim, 0 when the action is one gpufrag
 * takes from elsewhere (or a null address). Never blocks, never allocates. */
static inline int gpufrag_trace_entry(const struct gpufrag_shim_calls *s, int action, uint64_t addr, uint64_t size,
				      uint64_t stream, int device)
{
	switch (action) {
	case GPUFRAG_TE_ALLOC:
		if (!addr)
			return 0;
		s->block_alloc_on_stream(addr, 0, size, device, stream);
		return 1;
	case GPUFRAG_TE_FREE_COMPLETED:
		if (!addr)
			return 0;
		s->block_free(addr, device);
		return 1;
	case GPUFRAG_TE_OOM:
		s->oom(size, addr, device);
		return 1;
	default:
		return 0;
	}
}

#ifdef __cplusplus
}
#endif
#endif
