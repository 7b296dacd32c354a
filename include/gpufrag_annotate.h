/* gpufrag_annotate.h: the framework annotation API.
 *
 * A caching allocator that gpufrag cannot see into (its blocks live in its own code) says what it
 * does by calling the gpufrag_announce_* functions below (four, and three of them in a `_by`
 * form that names the allocator). Header-only: include it, call
 * them; nothing to link, no build step, no dependency (only <stdint.h> and, for the shim path,
 * dlsym from the C library). Each call reaches gpufrag two ways, both free when unused:
 *
 * - USDT probes `gpufrag:segment`, `gpufrag:block_alloc`, `gpufrag:block_free`, `gpufrag:oom`
 *   (a `.note.stapsdt` entry and a nop, written here in the layout of <sys/sdt.h>, so no
 *   systemtap headers are needed), for `gpufrag attach` and `gpufrag agent` (eBPF). Each probe is
 *   gated by its semaphore (in `.probes`): the arguments are not even computed unless a tracer
 *   is attached.
 * - The functions the LD_PRELOAD shim (libgpufrag_preload.so) exports, looked up once with
 *   dlsym(RTLD_DEFAULT, "gpufrag_annotate_...") and called only when found, for `gpufrag run`.
 *   Define GPUFRAG_ANNOTATE_NO_SHIM before including this header to leave that path out.
 *
 * They never block and never fail; with no tracer each costs a load and a branch (plus, for the
 * shim path, a relaxed load of a cached pointer, two for a `_by` call without the shim). gpufrag_announce_block_free must be called
 * before the block can be handed out again (before it goes back on the free lists).
 *
 * PyTorch needs none of this (gpufrag reads its blocks through its allocator trace tracker, its
 * snapshot API or its own USDT probes); simcuda-workload's caching allocator uses it.
 *
 * Which allocator: an allocator whose rules are not PyTorch's caching allocator's says which one
 * it is with the `_by` variants (gpufrag_announce_segment_by, _block_alloc_by, _oom_by), whose
 * last argument is one of the GPUFRAG_ALLOCATOR_* ids below; the plain calls mean
 * GPUFRAG_ALLOCATOR_DEFAULT. gpufrag then places the blocks by that allocator's rules (rounding,
 * splitting, what a free byte is worth) and judges its OOMs in its terms (verdict and fix). A
 * block_free needs no id: the block is found by its address.
 *
 * USDT arguments (the ABI; all 8 bytes; `device` and `allocator` signed):
 *   gpufrag:segment     (addr, device, allocator)
 *   gpufrag:block_alloc (addr, size, requested, device, allocator)
 *   gpufrag:block_free  (addr, device)
 *   gpufrag:oom         (requested, device_free, device, allocator)   device_free UINT64_MAX = unknown
 * `allocator` is always the last argument, added after the others: binaries built with an older
 * header have probes without it (2, 4 and 3 arguments), which gpufrag reads as allocator 0, the
 * default. An argument is never removed or reordered; a new one goes after the last. Likewise the
 * shim's exports: the plain gpufrag_annotate_* functions keep their signatures, and the `_by` ones
 * take the allocator last; the `_by` calls here fall back to the plain exports (the default
 * allocator) under a shim that predates them.
 */
#ifndef GPUFRAG_ANNOTATE_H
#define GPUFRAG_ANNOTATE_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Allocator ids: the place of the allocator in gpufrag's table of allocator models (REGISTRY in
 * src/alloc/mod.rs, append-only; an id is never reused), each named after the model's name in
 * gpufrag's output. gpufrag carries the id in bits 16-19 of the event's flags. An id outside 0-15,
 * or one this gpufrag does not know, reads as the default. */
#define GPUFRAG_ALLOCATOR_DEFAULT 0 /* PyTorch's caching rules: what the plain calls and old binaries mean */
#define GPUFRAG_ALLOCATOR_PYTORCH 0 /* PyTorch's CUDACachingAllocator */
#define GPUFRAG_ALLOCATOR_XLA 1     /* XLA's BFC allocator (JAX, TensorFlow) */
#define GPUFRAG_ALLOCATOR_CUPY 2    /* CuPy's MemoryPool */
#define GPUFRAG_ALLOCATOR_RMM 3     /* RAPIDS RMM's pool_memory_resource */

/* The shim's exports (what `gpufrag run` receives). Programs do not call these directly. */
/* The allocator owns the segment (or mapped range) holding addr: its free space is cache. */
void gpufrag_annotate_segment(uint64_t addr, int device);
/* A block [addr, addr + size) was handed out for a request of `requested` bytes. */
void gpufrag_annotate_block_alloc(uint64_t addr, uint64_t size, uint64_t requested, int device);
/* The same, with the stream the block was allocated on (a caching allocator with per-stream
 * pools, e.g. PyTorch's trace tracker in python/torch_tracker.cpp). */
void gpufrag_annotate_block_alloc_on_stream(uint64_t addr, uint64_t size, uint64_t requested, int device, uint64_t stream);
/* The block at addr went back to the cache. */
void gpufrag_annotate_block_free(uint64_t addr, int device);
/* A request of `requested` bytes failed for good (after the allocator's own retries);
 * device_free is what the device had free then, or UINT64_MAX when unknown. */
void gpufrag_annotate_oom(uint64_t requested, uint64_t device_free, int device);
/* The same three, naming the allocator (a GPUFRAG_ALLOCATOR_* id, last). */
void gpufrag_annotate_segment_by(uint64_t addr, int device, int allocator);
void gpufrag_annotate_block_alloc_by(uint64_t addr, uint64_t size, uint64_t requested, int device, int allocator);
void gpufrag_annotate_oom_by(uint64_t requested, uint64_t device_free, int device, int allocator);

#if defined(__x86_64__) || defined(__aarch64__)
#define GPUFRAG_USDT_SUPPORTED 1
#endif

#ifdef GPUFRAG_USDT_SUPPORTED
/* The probes' semaphores, in `.probes` where tracers look for them; weak and hidden, so every
 * translation unit of a binary shares them and each shared object has its own. The kernel
 * raises one while a tracer is attached to its probe. Page-aligned: the kernel finds a
 * semaphore by file offset in the first writable mapping of that file page, and a binary linked
 * by lld (Rust's default) maps the first file page of its data segment twice, at the end of the
 * RELRO segment too, so a semaphore sharing that page would be raised in the wrong place in
 * processes started after the tracer attached. */
struct gpufrag_semaphores {
	unsigned short segment, block_alloc, block_free, oom;
};
__attribute__((weak, visibility("hidden"), section(".probes"), aligned(4096))) volatile struct gpufrag_semaphores gpufrag_semaphores;
#define GPUFRAG_SEMA_OFF_segment 0
#define GPUFRAG_SEMA_OFF_block_alloc 2
#define GPUFRAG_SEMA_OFF_block_free 4
#define GPUFRAG_SEMA_OFF_oom 6
#define GPUFRAG_STR(x) #x
#define GPUFRAG_XSTR(x) GPUFRAG_STR(x)

#define GPUFRAG_NOP "nop"
/* An argument as `SIZE@OPERAND`, the operand in a register (%rax on x86-64, x0 on arm64). */
#define GPUFRAG_ARG(n) "-8@%[a" #n "]"

/* The note <sys/sdt.h> writes (stapsdt version 3): the probe's address, the base of
 * .stapsdt.base (for prelink adjustment), the semaphore's address, provider, name, arguments. */
#define GPUFRAG_USDT_NOTE(name, args)                                                         \
	"990: " GPUFRAG_NOP "\n"                                                              \
	".pushsection .note.stapsdt,\"?\",\"note\"\n"                                         \
	".balign 4\n"                                                                         \
	".4byte 992f-991f, 994f-993f, 3\n"                                                    \
	"991: .asciz \"stapsdt\"\n"                                                           \
	"992: .balign 4\n"                                                                    \
	"993: .8byte 990b\n"                                                                  \
	".8byte _.stapsdt.base\n"                                                             \
	".8byte gpufrag_semaphores+" GPUFRAG_XSTR(GPUFRAG_SEMA_OFF_##name) "\n"                  \
	".asciz \"gpufrag\"\n"                                                                \
	".asciz \"" #name "\"\n"                                                              \
	".asciz \"" args "\"\n"                                                               \
	"994: .balign 4\n"                                                                    \
	".popsection\n"                                                                       \
	".ifndef _.stapsdt.base\n"                                                            \
	".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"              \
	".weak _.stapsdt.base\n"                                                              \
	".hidden _.stapsdt.base\n"                                                            \
	"_.stapsdt.base: .space 1\n"                                                          \
	".size _.stapsdt.base, 1\n"                                                           \
	".popsection\n"                                                                       \
	".endif\n"

#define GPUFRAG_USDT2(name, x0, x1)                                                             \
	__asm__ __volatile__(GPUFRAG_USDT_NOTE(name, GPUFRAG_ARG(0) " " GPUFRAG_ARG(1))            \
			     : : [a0] "r"((int64_t)(x0)), [a1] "r"((int64_t)(x1)))
#define GPUFRAG_USDT3(name, x0, x1, x2)                                                         \
	__asm__ __volatile__(GPUFRAG_USDT_NOTE(name, GPUFRAG_ARG(0) " " GPUFRAG_ARG(1) " " GPUFRAG_ARG(2)) \
			     : : [a0] "r"((int64_t)(x0)), [a1] "r"((int64_t)(x1)), [a2] "r"((int64_t)(x2)))
#define GPUFRAG_USDT4(name, x0, x1, x2, x3)                                                     \
	__asm__ __volatile__(GPUFRAG_USDT_NOTE(name, GPUFRAG_ARG(0) " " GPUFRAG_ARG(1) " " GPUFRAG_ARG(2) " " GPUFRAG_ARG(3)) \
			     : : [a0] "r"((int64_t)(x0)), [a1] "r"((int64_t)(x1)), [a2] "r"((int64_t)(x2)), [a3] "r"((int64_t)(x3)))
#define GPUFRAG_USDT5(name, x0, x1, x2, x3, x4)                                                 \
	__asm__ __volatile__(GPUFRAG_USDT_NOTE(name, GPUFRAG_ARG(0) " " GPUFRAG_ARG(1) " " GPUFRAG_ARG(2) " " GPUFRAG_ARG(3) " " GPUFRAG_ARG(4)) \
			     : : [a0] "r"((int64_t)(x0)), [a1] "r"((int64_t)(x1)), [a2] "r"((int64_t)(x2)), [a3] "r"((int64_t)(x3)), [a4] "r"((int64_t)(x4)))
#define GPUFRAG_USDT_ON(name) __builtin_expect(gpufrag_semaphores.name != 0, 0)
#else
#define GPUFRAG_USDT2(name, x0, x1) ((void)0)
#define GPUFRAG_USDT3(name, x0, x1, x2) ((void)0)
#define GPUFRAG_USDT4(name, x0, x1, x2, x3) ((void)0)
#define GPUFRAG_USDT5(name, x0, x1, x2, x3, x4) ((void)0)
#define GPUFRAG_USDT_ON(name) 0
#endif

#ifndef GPUFRAG_ANNOTATE_NO_SHIM
#include <dlfcn.h>
/* RTLD_DEFAULT (glibc and musl): declared by <dlfcn.h> only under _GNU_SOURCE. */
#define GPUFRAG_RTLD_DEFAULT ((void *)0)

typedef void (*gpufrag_segment_fn)(uint64_t, int);
typedef void (*gpufrag_block_alloc_fn)(uint64_t, uint64_t, uint64_t, int);
typedef void (*gpufrag_block_free_fn)(uint64_t, int);
typedef void (*gpufrag_oom_fn)(uint64_t, uint64_t, int);
typedef void (*gpufrag_segment_by_fn)(uint64_t, int, int);
typedef void (*gpufrag_block_alloc_by_fn)(uint64_t, uint64_t, uint64_t, int, int);
typedef void (*gpufrag_oom_by_fn)(uint64_t, uint64_t, int, int);

/* The shim's function `name`, looked up once (a benign race: every thread stores the same
 * value); 0 when the shim is not loaded. */
#define GPUFRAG_SHIM_FN(var, type, name)                                                         \
	static void *var##_ptr;                                                                  \
	static int var##_looked;                                                                 \
	if (!__atomic_load_n(&var##_looked, __ATOMIC_ACQUIRE)) {                                 \
		__atomic_store_n(&var##_ptr, dlsym(GPUFRAG_RTLD_DEFAULT, name), __ATOMIC_RELAXED); \
		__atomic_store_n(&var##_looked, 1, __ATOMIC_RELEASE);                            \
	}                                                                                        \
	union {                                                                                  \
		void *p;                                                                         \
		type f;                                                                          \
	} var##_u;                                                                               \
	var##_u.p = __atomic_load_n(&var##_ptr, __ATOMIC_RELAXED);                               \
	type var = var##_u.f
#endif

/* The allocator `allocator` (a GPUFRAG_ALLOCATOR_* id) owns the segment (or mapped range) holding
 * addr: its free space is cache. */
static inline void gpufrag_announce_segment_by(uint64_t addr, int device, int allocator)
{
	if (GPUFRAG_USDT_ON(segment))
		GPUFRAG_USDT3(segment, addr, device, allocator);
#ifndef GPUFRAG_ANNOTATE_NO_SHIM
	GPUFRAG_SHIM_FN(f, gpufrag_segment_by_fn, "gpufrag_annotate_segment_by");
	if (f) {
		f(addr, device, allocator);
		return;
	}
	GPUFRAG_SHIM_FN(old, gpufrag_segment_fn, "gpufrag_annotate_segment");
	if (old)
		old(addr, device);
#endif
}

/* The allocator owns the segment (or mapped range) holding addr: its free space is cache. */
static inline void gpufrag_announce_segment(uint64_t addr, int device)
{
	gpufrag_announce_segment_by(addr, device, GPUFRAG_ALLOCATOR_DEFAULT);
}

/* A block [addr, addr + size) of the allocator `allocator` was handed out for a request of
 * `requested` bytes (size 0: the tracer applies that allocator's rounding and split rules). */
static inline void gpufrag_announce_block_alloc_by(uint64_t addr, uint64_t size, uint64_t requested, int device, int allocator)
{
	if (GPUFRAG_USDT_ON(block_alloc))
		GPUFRAG_USDT5(block_alloc, addr, size, requested, device, allocator);
#ifndef GPUFRAG_ANNOTATE_NO_SHIM
	GPUFRAG_SHIM_FN(f, gpufrag_block_alloc_by_fn, "gpufrag_annotate_block_alloc_by");
	if (f) {
		f(addr, size, requested, device, allocator);
		return;
	}
	GPUFRAG_SHIM_FN(old, gpufrag_block_alloc_fn, "gpufrag_annotate_block_alloc");
	if (old)
		old(addr, size, requested, device);
#endif
}

/* A block [addr, addr + size) was handed out for a request of `requested` bytes (size 0: the
 * tracer applies the allocator's rounding rules). */
static inline void gpufrag_announce_block_alloc(uint64_t addr, uint64_t size, uint64_t requested, int device)
{
	gpufrag_announce_block_alloc_by(addr, size, requested, device, GPUFRAG_ALLOCATOR_DEFAULT);
}

/* The block at addr goes back to the cache (call it before the block can be reused). */
static inline void gpufrag_announce_block_free(uint64_t addr, int device)
{
	if (GPUFRAG_USDT_ON(block_free))
		GPUFRAG_USDT2(block_free, addr, device);
#ifndef GPUFRAG_ANNOTATE_NO_SHIM
	GPUFRAG_SHIM_FN(f, gpufrag_block_free_fn, "gpufrag_annotate_block_free");
	if (f)
		f(addr, device);
#endif
}

/* A request of `requested` bytes to the allocator `allocator` failed for good (after its own
 * retries); device_free is what the device had free then (UINT64_MAX when unknown). */
static inline void gpufrag_announce_oom_by(uint64_t requested, uint64_t device_free, int device, int allocator)
{
	if (GPUFRAG_USDT_ON(oom))
		GPUFRAG_USDT4(oom, requested, device_free, device, allocator);
#ifndef GPUFRAG_ANNOTATE_NO_SHIM
	GPUFRAG_SHIM_FN(f, gpufrag_oom_by_fn, "gpufrag_annotate_oom_by");
	if (f) {
		f(requested, device_free, device, allocator);
		return;
	}
	GPUFRAG_SHIM_FN(old, gpufrag_oom_fn, "gpufrag_annotate_oom");
	if (old)
		old(requested, device_free, device);
#endif
}

/* A request of `requested` bytes failed for good (after the allocator's own retries);
 * device_free is what the device had free then (UINT64_MAX when unknown). */
static inline void gpufrag_announce_oom(uint64_t requested, uint64_t device_free, int device)
{
	gpufrag_announce_oom_by(requested, device_free, device, GPUFRAG_ALLOCATOR_DEFAULT);
}

#ifdef __cplusplus
}
#endif

#endif
