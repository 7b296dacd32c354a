/* fake_c10_usdt.c: a stand-in libc10_cuda.so with PyTorch's USDT probes pytorch:malloc(ptr,
 * device, size, stream) and pytorch:free(ptr), semaphore-gated as in PyTorch; blocks are carved
 * in order from a base address the test program sets. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

unsigned short pytorch_malloc_semaphore __attribute__((section(".probes")));
unsigned short pytorch_free_semaphore __attribute__((section(".probes")));

static unsigned long long next_block;

void fake_set_base(unsigned long long base)
{
	next_block = base;
}

void *fake_malloc(unsigned long size, signed char device)
{
	void *p = (void *)next_block;
	next_block += (size + 511) & ~511ul;
	if (pytorch_malloc_semaphore)
		STAP_PROBE4(pytorch, malloc, p, device, size, (void *)0);
	return p;
}

void fake_free(void *p)
{
	if (pytorch_free_semaphore)
		STAP_PROBE1(pytorch, free, p);
}

/* PyTorch's raw entry points, under NativeCachingAllocator's mangled names (this, ...): in
 * PyTorch they call the allocator's malloc()/free() directly, so neither USDT probe fires. */
void *raw_alloc(void *self, unsigned long size) __asm__("_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator9raw_allocEm");
void *raw_alloc_with_stream(void *self, unsigned long size, void *stream) __asm__(
	"_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator21raw_alloc_with_streamEmP11CUstream_st");
void raw_delete(void *self, void *p) __asm__("_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator10raw_deleteEPv");

static char allocator;

/* The allocator's malloc() as the raw entry points reach it: no probe. */
static __attribute__((noinline)) void *carve(unsigned long size)
{
	void *p = (void *)next_block;
	next_block += (size + 511) & ~511ul;
	return p;
}

__attribute__((noinline)) void *raw_alloc(void *self, unsigned long size)
{
	__asm__ volatile("" : : "r"(self) : "memory");
	return carve(size);
}

__attribute__((noinline)) void *raw_alloc_with_stream(void *self, unsigned long size, void *stream)
{
	__asm__ volatile("" : : "r"(self), "r"(stream) : "memory");
	return carve(size);
}

__attribute__((noinline)) void raw_delete(void *self, void *p)
{
	__asm__ volatile("" : : "r"(self), "r"(p) : "memory");
}

void *fake_raw_alloc(unsigned long size, int with_stream)
{
	return with_stream ? raw_alloc_with_stream(&allocator, size, (void *)0) : raw_alloc(&allocator, size);
}

void fake_raw_free(void *p)
{
	raw_delete(&allocator, p);
}
