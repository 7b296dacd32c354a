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
