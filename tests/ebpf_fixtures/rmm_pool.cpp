/* rmm_pool.cpp: a program with its own pool allocator that follows RAPIDS RMM's
 * `pool_memory_resource` rules (as src/alloc/rmm.rs cites them from rapidsai/rmm: requests
 * aligned up to 256 bytes; best fit, the smallest free block that fits, the first in address order
 * among equals; every block split at the aligned size; a freed block merges with its free
 * neighbours, never across the head of an upstream allocation; growth by max(size, pool size) with
 * no maximum, or max(size, remaining / 2) under one, a failed upstream allocation retried at half
 * the size down to the request, then out_of_memory; nothing returned upstream while the pool
 * lives), written here independently of gpufrag's model. It announces its upstream allocations,
 * blocks and final failure as RMM's through include/gpufrag_annotate.h (`_by` calls with
 * GPUFRAG_ALLOCATOR_RMM; block sizes 0, so that gpufrag applies RMM's rules itself), drives itself
 * to a fragmentation OOM, and prints its own accounting ("FIGURES key=value ...") for the tests to
 * compare with what gpufrag reconstructs.
 *
 * usage: rmm_pool [gate FILE]   (gate: wait until FILE exists before touching CUDA, so that
 *                                `gpufrag attach` can attach first)
 * Upstream is cuMemAlloc_v2 of libcuda.so.1 (dlopened: the simcuda stand-in in CI). The run wants
 * a device with 72 MiB usable (SIMCUDA_MEM=136MiB, SIMCUDA_RESERVE=64MiB): the pool takes 64 MiB
 * and its last growth fails with 8 MiB still free on the device. Built against the header from
 * before the allocator id (tests/ebpf_fixtures/annotate_v1/, no GPUFRAG_ALLOCATOR_RMM) it announces
 * with the plain calls, as every program built then does: gpufrag's default allocator.
 */
#include "gpufrag_annotate.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>

namespace {

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

CUresult (*cuInit)(unsigned);
CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
CUresult (*cuCtxSetCurrent)(CUcontext);
CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);

constexpr uint64_t MIB = 1ull << 20;
constexpr uint64_t ALIGNMENT = 256; /* rmm::CUDA_ALLOCATION_ALIGNMENT */

template <typename F> void sym(void *h, const char *name, F &f)
{
	void *p = dlsym(h, name);
	if (!p) {
		std::fprintf(stderr, "rmm_pool: no %s\n", name);
		std::exit(3);
	}
	f = reinterpret_cast<F>(p);
}

void check(CUresult rc, const char *what)
{
	if (rc) {
		std::fprintf(stderr, "rmm_pool: %s failed: %d\n", what, rc);
		std::exit(4);
	}
}

#ifdef GPUFRAG_ALLOCATOR_RMM
void announce_segment(uint64_t addr)
{
	gpufrag_announce_segment_by(addr, 0, GPUFRAG_ALLOCATOR_RMM);
}

void announce_block(uint64_t addr, uint64_t requested)
{
	gpufrag_announce_block_alloc_by(addr, 0, requested, 0, GPUFRAG_ALLOCATOR_RMM);
}

void announce_oom(uint64_t requested, uint64_t device_free)
{
	gpufrag_announce_oom_by(requested, device_free, 0, GPUFRAG_ALLOCATOR_RMM);
}
#else
/* The header from before the allocator id: the plain calls. */
void announce_segment(uint64_t addr)
{
	gpufrag_announce_segment(addr, 0);
}

void announce_block(uint64_t addr, uint64_t requested)
{
	gpufrag_announce_block_alloc(addr, 0, requested, 0);
}

void announce_oom(uint64_t requested, uint64_t device_free)
{
	gpufrag_announce_oom(requested, device_free, 0);
}
#endif

struct Block {
	uint64_t size;
	bool head; /* the start of an upstream allocation */
};

/* The pool: free and allocated blocks by address, the upstream allocations, the cap. */
class Pool {
	std::map<uint64_t, Block> free_, used_;
	uint64_t pool_size_ = 0;
	uint64_t maximum_; /* 0: none */
	int upstreams_ = 0;

	static uint64_t align_up(uint64_t n) { return (n + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT; }

	/* block_from_upstream: a new upstream allocation, a free head block. */
	bool upstream(uint64_t size)
	{
		CUdeviceptr p = 0;
		if (cuMemAlloc_v2(&p, size) != 0)
			return false;
		announce_segment(p);
		free_[p] = Block{ size, true };
		pool_size_ += size;
		upstreams_++;
		return true;
	}

	/* size_to_grow, then try_to_expand: halve down to the request on an upstream failure. */
	bool expand(uint64_t size)
	{
		uint64_t want;
		if (maximum_) {
			uint64_t remaining = align_up(maximum_ > pool_size_ ? maximum_ - pool_size_ : 0);
			if (size > remaining)
				return false;
			want = size > remaining / 2 ? size : remaining / 2;
		} else {
			want = size > pool_size_ ? size : pool_size_;
		}
		for (;;) {
			if (upstream(want))
				return true;
			if (want == size)
				return false;
			want = want / 2 > size ? want / 2 : size;
		}
	}

	/* coalescing_free_list::get_block: best fit, the first in address order among equals. */
	std::map<uint64_t, Block>::iterator best_fit(uint64_t size)
	{
		auto best = free_.end();
		for (auto it = free_.begin(); it != free_.end(); ++it)
			if (it->second.size >= size && (best == free_.end() || it->second.size < best->second.size))
				best = it;
		return best;
	}

public:
	Pool(uint64_t initial, uint64_t maximum) : maximum_(maximum)
	{
		if (initial && !upstream(initial)) {
			std::fprintf(stderr, "rmm_pool: the initial pool of %llu bytes failed\n", (unsigned long long)initial);
			std::exit(5);
		}
	}

	/* do_allocate: 0 on rmm::out_of_memory (announced). */
	uint64_t allocate(uint64_t bytes)
	{
		if (bytes == 0)
			return 0;
		uint64_t size = align_up(bytes);
		auto it = best_fit(size);
		if (it == free_.end()) {
			if (!expand(size)) {
				size_t free_b = 0, total = 0;
				check(cuMemGetInfo_v2(&free_b, &total), "cuMemGetInfo_v2");
				announce_oom(bytes, free_b);
				std::printf("OOM requested=%llu device_free=%llu\n", (unsigned long long)bytes, (unsigned long long)free_b);
				return 0;
			}
			it = best_fit(size);
		}
		uint64_t addr = it->first;
		Block b = it->second;
		free_.erase(it);
		/* allocate_from_block: always split; the rest, any size, stays free (not a head). */
		if (b.size > size)
			free_[addr + size] = Block{ b.size - size, false };
		used_[addr] = Block{ size, b.head };
		announce_block(addr, bytes);
		return addr;
	}

	/* do_deallocate: announced first (before the block can be handed out again), then merged
	 * with its free neighbours where the later of two is no head. */
	void deallocate(uint64_t addr)
	{
		auto u = used_.find(addr);
		if (u == used_.end()) {
			std::fprintf(stderr, "rmm_pool: freeing %#llx, not a block\n", (unsigned long long)addr);
			std::exit(6);
		}
		gpufrag_announce_block_free(addr, 0);
		Block b = u->second;
		used_.erase(u);
		auto next = free_.lower_bound(addr);
		if (next != free_.end() && addr + b.size == next->first && !next->second.head) {
			b.size += next->second.size;
			next = free_.erase(next);
		}
		if (next != free_.begin()) {
			auto prev = std::prev(next);
			if (prev->first + prev->second.size == addr && !b.head) {
				prev->second.size += b.size;
				return;
			}
		}
		free_[addr] = b;
	}

	/* The pool's own figures: every free byte is stranded (release() only in the destructor). */
	void print_figures() const
	{
		uint64_t allocated = 0, free_bytes = 0, largest = 0;
		for (auto &kv : used_)
			allocated += kv.second.size;
		for (auto &kv : free_) {
			free_bytes += kv.second.size;
			largest = kv.second.size > largest ? kv.second.size : largest;
		}
		if (allocated + free_bytes != pool_size_) {
			std::fprintf(stderr, "rmm_pool: blocks sum to %llu, the pool is %llu\n", (unsigned long long)(allocated + free_bytes),
				     (unsigned long long)pool_size_);
			std::exit(7);
		}
		std::printf("FIGURES device=0 reserved=%llu segments=%d blocks=%zu allocated=%llu stranded=%llu releasable=0 largest_free_block=%llu\n",
			    (unsigned long long)pool_size_, upstreams_, used_.size(), (unsigned long long)allocated,
			    (unsigned long long)free_bytes, (unsigned long long)largest);
	}
};

void load()
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		std::fprintf(stderr, "rmm_pool: %s\n", dlerror());
		std::exit(2);
	}
	sym(h, "cuInit", cuInit);
	sym(h, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain);
	sym(h, "cuCtxSetCurrent", cuCtxSetCurrent);
	sym(h, "cuMemAlloc_v2", cuMemAlloc_v2);
	sym(h, "cuMemGetInfo_v2", cuMemGetInfo_v2);
	check(cuInit(0), "cuInit");
	CUcontext ctx;
	check(cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

} // namespace

int main(int argc, char **argv)
{
	if (argc == 3 && !std::strcmp(argv[1], "gate")) {
		struct stat st;
		while (stat(argv[2], &st) != 0)
			usleep(10000);
	} else if (argc != 1) {
		std::fprintf(stderr, "usage: rmm_pool [gate FILE]\n");
		return 1;
	}
	load();
	/* rmm::mr::pool_memory_resource(upstream, initial_pool_size = 32 MiB), no maximum; it stays
	 * the device's resource for the whole run (never destroyed: nothing goes back upstream). */
	Pool *pool = new Pool(32 * MIB, 0);
	uint64_t a = pool->allocate(12 * MIB + 100);  /* 12 MiB + 256 */
	uint64_t b = pool->allocate(12 * MIB - 1000); /* 12 MiB - 768 */
	uint64_t c = pool->allocate(7 * MIB + 3);     /* 7 MiB + 256: 1 MiB + 256 left at the end */
	uint64_t d = pool->allocate(16 * MIB);        /* nothing fits: the pool doubles (32 MiB more) */
	uint64_t e = pool->allocate(15 * MIB + 1);    /* 15 MiB + 256 after d: 1 MiB - 256 left */
	pool->deallocate(b);                          /* a 12 MiB - 768 hole between a and c */
	pool->deallocate(d);                          /* the second allocation's first 16 MiB */
	pool->deallocate(c);                          /* merges with b's hole and the tail: 20 MiB - 256 */
	uint64_t y = pool->allocate(900 * 1024 + 10); /* best fit: the 1 MiB - 256 tail, not 16 or 20 MiB */
	/* 24 MiB: 36 MiB free in the pool, no block of it over 20 MiB, 8 MiB on the device; growth
	 * tries 64, 32 and 24 MiB upstream and fails: rmm::out_of_memory. */
	uint64_t x = pool->allocate(24 * MIB);
	if (x)
		std::fprintf(stderr, "rmm_pool: the fragmented pool served 24 MiB\n");
	(void)a;
	(void)e;
	(void)y;
	pool->print_figures();
	return 0;
}
