// fake_c10_symbols.cpp: a stand-in libc10_cuda.so without USDT probes, whose allocator functions
// are hidden (local in .symtab only), named as in PyTorch:
// c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char,
// unsigned long, CUstream_st*) and c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*).
struct CUstream_st;

namespace c10 {
namespace cuda {
namespace CUDACachingAllocator {
namespace Native {

static unsigned long long next_block;

class NativeCachingAllocator {
public:
	void malloc(void **devPtr, signed char device, unsigned long size, CUstream_st *stream);
	// As in PyTorch: raw_alloc and raw_alloc_with_stream call malloc() (its uprobe sees them),
	// raw_delete frees without local_raw_delete (only its own uprobe sees it).
	void *raw_alloc(unsigned long size);
	void *raw_alloc_with_stream(unsigned long size, CUstream_st *stream);
	void raw_delete(void *ptr);
};

__attribute__((noinline)) void *NativeCachingAllocator::raw_alloc(unsigned long size)
{
	void *p = 0;
	malloc(&p, 0, size, 0);
	return p;
}

__attribute__((noinline)) void *NativeCachingAllocator::raw_alloc_with_stream(unsigned long size, CUstream_st *stream)
{
	void *p = 0;
	malloc(&p, 0, size, stream);
	return p;
}

__attribute__((noinline)) void NativeCachingAllocator::raw_delete(void *ptr)
{
	asm volatile("" : : "r"(ptr) : "memory");
}

__attribute__((noinline)) void NativeCachingAllocator::malloc(void **devPtr, signed char device, unsigned long size, CUstream_st *stream)
{
	*devPtr = (void *)next_block;
	next_block += (size + 511) & ~511ul;
	asm volatile("" : : "r"(device), "r"(stream) : "memory");
}

__attribute__((noinline)) void local_raw_delete(void *ptr)
{
	asm volatile("" : : "r"(ptr) : "memory");
}

static NativeCachingAllocator allocator;

} // namespace Native
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

using namespace c10::cuda::CUDACachingAllocator::Native;

extern "C" __attribute__((visibility("default"))) void fake_set_base(unsigned long long base)
{
	next_block = base;
}

extern "C" __attribute__((visibility("default"))) void *fake_malloc(unsigned long size, signed char device)
{
	void *p = 0;
	allocator.malloc(&p, device, size, 0);
	return p;
}

extern "C" __attribute__((visibility("default"))) void fake_free(void *p)
{
	local_raw_delete(p);
}

extern "C" __attribute__((visibility("default"))) void *fake_raw_alloc(unsigned long size, int with_stream)
{
	return with_stream ? allocator.raw_alloc_with_stream(size, 0) : allocator.raw_alloc(size);
}

extern "C" __attribute__((visibility("default"))) void fake_raw_free(void *p)
{
	allocator.raw_delete(p);
}
