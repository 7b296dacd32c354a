// fake_xla_bfc.cpp: a stand-in for JAX's xla_cuda_plugin.so whose allocator is a small
// tsl::BFCAllocator over one preallocated region (JAX's default pool), plus a second instance
// over host memory (XLA's pinned-host allocator), with the member functions
// named as in XLA (local in .symtab only, as in the real plugin):
//   tsl::BFCAllocator::AllocateRaw(unsigned long, unsigned long, tsl::AllocationAttributes const&)
//   tsl::BFCAllocator::AllocateRaw(unsigned long, unsigned long)   (inline, calls the other)
//   tsl::BFCAllocator::DeallocateRaw(void*)
// It follows BFC's rules (256-byte rounding, best fit: smallest free chunk that fits, lowest
// address first; split when the chunk is at least twice the rounded size or 128 MiB more; merge
// with free neighbours on free) and reports its own statistics, which the test compares with
// what gpufrag computed from the probes alone.
#include <cstddef>

namespace tsl {

struct AllocationAttributes {
	bool retry_on_failure = true;
};

class BFCAllocator {
public:
	void Init(unsigned long base, unsigned long size);
	void *AllocateRaw(unsigned long alignment, unsigned long num_bytes, const AllocationAttributes &attrs);
	__attribute__((noinline)) void *AllocateRaw(unsigned long alignment, unsigned long num_bytes)
	{
		return AllocateRaw(alignment, num_bytes, AllocationAttributes());
	}
	void DeallocateRaw(void *ptr);
	void Stats(unsigned long *in_use, unsigned long *largest_free, unsigned long *pool);

private:
	static const int kMax = 256;
	unsigned long addr_[kMax], size_[kMax];
	bool used_[kMax];
	int n_ = 0;
	unsigned long pool_ = 0;
	void Insert(int at, unsigned long a, unsigned long s, bool u);
	void Remove(int at);
};

void BFCAllocator::Init(unsigned long base, unsigned long size)
{
	n_ = 0;
	pool_ = size;
	Insert(0, base, size, false);
}

void BFCAllocator::Insert(int at, unsigned long a, unsigned long s, bool u)
{
	for (int i = n_; i > at; i--) {
		addr_[i] = addr_[i - 1];
		size_[i] = size_[i - 1];
		used_[i] = used_[i - 1];
	}
	addr_[at] = a;
	size_[at] = s;
	used_[at] = u;
	n_++;
}

void BFCAllocator::Remove(int at)
{
	for (int i = at; i + 1 < n_; i++) {
		addr_[i] = addr_[i + 1];
		size_[i] = size_[i + 1];
		used_[i] = used_[i + 1];
	}
	n_--;
}

__attribute__((noinline)) void *BFCAllocator::AllocateRaw(unsigned long alignment, unsigned long num_bytes, const AllocationAttributes &attrs)
{
	asm volatile("" : : "r"(alignment), "r"(&attrs) : "memory");
	if (num_bytes == 0 || n_ + 1 >= kMax)
		return nullptr;
	unsigned long rounded = (num_bytes + 255) / 256 * 256;
	int best = -1;
	for (int i = 0; i < n_; i++)
		if (!used_[i] && size_[i] >= rounded && (best < 0 || size_[i] < size_[best]))
			best = i;
	if (best < 0)
		return nullptr;
	unsigned long rest = size_[best] - rounded;
	if (size_[best] >= 2 * rounded || rest >= (128ul << 20)) {
		size_[best] = rounded;
		Insert(best + 1, addr_[best] + rounded, rest, false);
	}
	used_[best] = true;
	return (void *)addr_[best];
}

__attribute__((noinline)) void BFCAllocator::DeallocateRaw(void *ptr)
{
	for (int i = 0; i < n_; i++) {
		if (addr_[i] != (unsigned long)ptr || !used_[i])
			continue;
		used_[i] = false;
		if (i + 1 < n_ && !used_[i + 1]) {
			size_[i] += size_[i + 1];
			Remove(i + 1);
		}
		if (i > 0 && !used_[i - 1]) {
			size_[i - 1] += size_[i];
			Remove(i);
		}
		return;
	}
}

void BFCAllocator::Stats(unsigned long *in_use, unsigned long *largest_free, unsigned long *pool)
{
	*in_use = *largest_free = 0;
	for (int i = 0; i < n_; i++) {
		if (used_[i])
			*in_use += size_[i];
		else if (size_[i] > *largest_free)
			*largest_free = size_[i];
	}
	*pool = pool_;
}

static BFCAllocator gpu_bfc;
// XLA's second instance: pinned host memory (GPU_0_bfc and the host allocator are both
// tsl::BFCAllocator; the probes see both, told apart by `this`).
static BFCAllocator host_bfc;

} // namespace tsl

extern "C" __attribute__((visibility("default"))) void fake_host_bfc_init(unsigned long base, unsigned long size)
{
	tsl::host_bfc.Init(base, size);
}

extern "C" __attribute__((visibility("default"))) void *fake_host_bfc_alloc(unsigned long size)
{
	return tsl::host_bfc.AllocateRaw(256, size, tsl::AllocationAttributes());
}

extern "C" __attribute__((visibility("default"))) void fake_host_bfc_free(void *p)
{
	tsl::host_bfc.DeallocateRaw(p);
}

extern "C" __attribute__((visibility("default"))) void fake_bfc_init(unsigned long base, unsigned long size)
{
	tsl::gpu_bfc.Init(base, size);
}

extern "C" __attribute__((visibility("default"))) void *fake_bfc_alloc(unsigned long size)
{
	return tsl::gpu_bfc.AllocateRaw(256, size, tsl::AllocationAttributes());
}

extern "C" __attribute__((visibility("default"))) void *fake_bfc_alloc_plain(unsigned long size)
{
	return tsl::gpu_bfc.AllocateRaw(256, size);
}

extern "C" __attribute__((visibility("default"))) void fake_bfc_free(void *p)
{
	tsl::gpu_bfc.DeallocateRaw(p);
}

extern "C" __attribute__((visibility("default"))) void fake_bfc_stats(unsigned long *in_use, unsigned long *largest_free, unsigned long *pool)
{
	tsl::gpu_bfc.Stats(in_use, largest_free, pool);
}
