// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* gpufrag.bpf.c: the eBPF half of gpufrag's kernel-side capture.
 *
 * Owns: the uprobes/uretprobes on libcuda's exported memory functions, the USDT (and .symtab
 * uprobe fallback) programs for PyTorch's caching allocator, the uprobes on XLA's BFC allocator
 * (tsl::BFCAllocator::AllocateRaw / DeallocateRaw, found by name in .symtab), the per-thread device tracking that
 * attributes allocations to a CUDA ordinal, and the raw tracepoints that follow forks and notice
 * exits. Everything it learns leaves as `struct gpufrag_event` (include/gpufrag_event.h, the one
 * wire format) through one ring buffer; what cannot be reserved there is counted per CPU in
 * `lost` and reported by user space as a Dropped event.
 *
 * Types. No vmlinux.h: uprobes need no kernel type but `struct pt_regs`, taken in its UAPI layout
 * from <asm/ptrace.h> (linux-libc-dev), which is what bpf_tracing.h's PT_REGS_* macros expect when
 * neither __KERNEL__ nor __VMLINUX_H__ is defined. The two raw tracepoints read task_struct
 * fields through CO-RE with the minimal `___gpufrag` flavours below, relocated against the
 * running kernel's BTF at load time. So the build needs no bpftool and no kernel headers beyond
 * the UAPI ones, and one object runs on any BTF kernel of the same architecture.
 *
 * Filtering. A uprobe on a file fires in every process that maps it. `traced` holds the thread
 * group ids to report; in agent mode (`trace_all`) every process is reported and enters `traced`
 * on its first event, so that its exit is reported too. With `follow_children`, a fork of a
 * traced process is traced from its first instruction.
 */
#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/usdt.bpf.h>

#include "gpufrag_event.h"

_Static_assert(sizeof(struct gpufrag_event) == 80, "gpufrag_event must stay 80 bytes");

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by user space before load. */
const volatile bool trace_all = false;
const volatile bool follow_children = false;
/* Wake the reader when this many bytes wait in the ring (user space sets an eighth of it). */
const volatile __u64 wakeup_bytes = 1 << 19;

/* The functions probed; an entry program saves its arguments under (thread, fn). */
enum gpufrag_fn {
	FN_MEM_ALLOC = 1,
	FN_MEM_ALLOC_PITCH,
	FN_MEM_ALLOC_MANAGED,
	FN_MEM_FREE,
	FN_ADDRESS_RESERVE,
	FN_ADDRESS_FREE,
	FN_MEM_CREATE,
	FN_MEM_RELEASE,
	FN_MEM_MAP,
	FN_MEM_UNMAP,
	FN_ALLOC_ASYNC,
	FN_ALLOC_FROM_POOL_ASYNC,
	FN_FREE_ASYNC,
	FN_POOL_TRIM_TO,
	FN_MEM_GET_INFO,
	/* device tracking */
	FN_PRIMARY_CTX_RETAIN,
	FN_CTX_SET_CURRENT,
	FN_CTX_CREATE,
	FN_CTX_PUSH_CURRENT,
	FN_CTX_POP_CURRENT,
	FN_CTX_GET_DEVICE,
	FN_POOL_CREATE,
	FN_DEFAULT_MEM_POOL,
	/* observed: what the program reads of a pool's reserved bytes */
	FN_POOL_GET_ATTRIBUTE,
	/* PyTorch caching allocator, .symtab fallback */
	FN_TORCH_MALLOC,
	/* XLA's BFC allocator: AllocateRaw(this, alignment, num_bytes, attrs) and its 2-argument overload */
	FN_BFC_ALLOC,
	FN_BFC_ALLOC_PLAIN,
	/* PyTorch's allocator entry points that its USDT probes miss (pytorch:malloc fires only in
	 * allocate()): raw_alloc(this, size_t) and raw_alloc_with_stream(this, size_t, cudaStream_t),
	 * each -> void* (CUB's temporary storage, cuBLAS/cuDNN workspaces, ...) */
	FN_TORCH_RAW_ALLOC,
	FN_TORCH_RAW_ALLOC_STREAM,
	/* torch._C._cuda_setMemoryFraction: THCPModule_setMemoryFraction(PyObject *self, PyObject *args) */
	FN_TORCH_FRACTION,
};

struct call {
	__u64 arg[5];
	__u64 entry_ns; /* when the call began: a free's event carries it (see finish_call) */
	__u64 valid;
	__u64 caller; /* a driver allocation's owner address (see owner_address), for its event */
};

#define FN_COUNT (FN_TORCH_FRACTION + 1)

/* Per thread, in task-local storage (freed with the thread; no hashing, no lock on the hot
 * path): one saved call per probed function, so that a probed function called from inside
 * another never overwrites its caller's arguments, and the thread's current device. */
struct thread_state {
	struct call slot[FN_COUNT];
	__s16 device; /* valid when device_known */
	__u16 device_known;
	__u32 rt_depth; /* runtime allocation calls (cudaMalloc family) the thread is inside */
	__u64 last_total; /* the total of the thread's latest cuMemGetInfo (0: none since it was cleared) */
	__u64 rt_caller; /* the return address of the outermost of them, while rt_depth > 0 */
};

/* (process, CUcontext or CUmemoryPool) -> device */
struct obj_key {
	__u64 obj;
	__u32 tgid;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22); /* 4 MiB, about 52,000 events; user space may resize */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} traced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct obj_key);
	__type(value, __s16);
} object_device SEC(".maps");

/* (process, device) -> its current memory pool, for cuMemAllocAsync (which names none) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct obj_key);
	__type(value, __u64);
} device_pool SEC(".maps");

static __always_inline bool is_traced(__u32 tgid)
{
	if (trace_all)
		return true;
	return bpf_map_lookup_elem(&traced, &tgid) != NULL;
}

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&lost, &zero);
	if (n)
		*n += 1;
}

static __always_inline struct gpufrag_event *reserve_event_at(__u64 ts, __u64 pid_tgid, __u16 kind, __s16 device, __u32 flags)
{
	struct gpufrag_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost();
		return NULL;
	}
	e->ts_ns = ts ? ts : bpf_ktime_get_ns(); /* CLOCK_MONOTONIC, the shim's clock */
	e->addr = 0;
	e->size = 0;
	e->requested = 0;
	e->handle = 0;
	e->stream = 0;
	e->device_free = 0;
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->kind = kind;
	e->device = device;
	e->rc = 0;
	e->flags = flags;
	e->op = 0;
	e->text_len = 0;
	return e;
}

static __always_inline struct gpufrag_event *reserve_event(__u64 pid_tgid, __u16 kind, __s16 device, __u32 flags)
{
	return reserve_event_at(0, pid_tgid, kind, device, flags);
}

/* Wake the reader only once the ring is an eighth full: a wakeup per record (the default) costs
 * the traced thread an irq_work and the reader a context switch per call, several times the
 * probe itself. User space polls with a timeout and drains on every round anyway. */
static __always_inline void submit_event(struct gpufrag_event *e)
{
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(e, avail >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* A failed allocation wakes the reader at once: user space reads the device's free memory for
 * it while the failing process is still alive (a process that exits right after its OOM gives
 * its memory back within ~100 ms, measured on the H200). */
static __always_inline void submit_now(struct gpufrag_event *e)
{
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

/* The calls whose event carries the time the call began (see finish_call): the releases, and a
 * read of a pool's reserved bytes. */
static __always_inline bool stamped_at_entry(__u32 fn)
{
	return fn == FN_MEM_FREE || fn == FN_ADDRESS_FREE || fn == FN_MEM_RELEASE || fn == FN_MEM_UNMAP || fn == FN_FREE_ASYNC ||
	       fn == FN_POOL_GET_ATTRIBUTE;
}

/* The return address of the probed function's caller, at its entry (the uprobe sits on its first
 * instruction): on x86-64 the word at the stack pointer, on arm64 the link register. */
static __always_inline __u64 return_address(struct pt_regs *ctx)
{
#if defined(__TARGET_ARCH_x86)
	__u64 ra = 0;
	bpf_probe_read_user(&ra, sizeof(ra), (const void *)PT_REGS_SP(ctx));
	return ra;
#elif defined(__TARGET_ARCH_arm64)
	return PT_REGS_RET(ctx);
#else
	return 0;
#endif
}

/* The calls whose event names its owner by an address (the consumer maps it to its file). */
static __always_inline bool owned_call(__u32 fn)
{
	return fn == FN_MEM_ALLOC || fn == FN_MEM_ALLOC_PITCH || fn == FN_MEM_ALLOC_MANAGED || fn == FN_MEM_CREATE;
}

/* A driver allocation's owner address: inside a runtime allocation call (cudaMalloc and its
 * family, probed in libcudart), the return address of the outermost one, that is the code that
 * asked the runtime (cuBLAS's workspace, not libcudart); else the driver call's own caller. The
 * shim's caller thunks give the same address (preload/src/caller.rs). */
static __always_inline __u64 owner_address(struct pt_regs *ctx, struct thread_state *t)
{
	return t->rt_depth ? t->rt_caller : return_address(ctx);
}

static __always_inline int save_call(struct pt_regs *ctx, __u32 fn)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (fn >= FN_COUNT || !is_traced(id >> 32))
		return 0;
	struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t)
		return 0;
	struct call *c = &t->slot[fn];
	c->arg[0] = PT_REGS_PARM1(ctx);
	c->arg[1] = PT_REGS_PARM2(ctx);
	c->arg[2] = PT_REGS_PARM3(ctx);
	c->arg[3] = PT_REGS_PARM4(ctx);
	c->arg[4] = PT_REGS_PARM5(ctx);
	c->entry_ns = stamped_at_entry(fn) ? bpf_ktime_get_ns() : 0;
	c->caller = owned_call(fn) ? owner_address(ctx, t) : 0;
	c->valid = 1;
	return 0;
}

static __always_inline __u64 read_user_u64(__u64 ptr)
{
	__u64 v = 0;
	if (ptr)
		bpf_probe_read_user(&v, sizeof(v), (const void *)ptr);
	return v;
}

static __always_inline __s32 read_user_s32(__u64 ptr)
{
	__s32 v = 0;
	if (ptr)
		bpf_probe_read_user(&v, sizeof(v), (const void *)ptr);
	return v;
}

static __always_inline __s16 device_of_object(__u32 tgid, __u64 obj)
{
	struct obj_key k = { .obj = obj, .tgid = tgid };
	__s16 *d = bpf_map_lookup_elem(&object_device, &k);
	return d ? *d : -1;
}

static __always_inline void set_object_device(__u32 tgid, __u64 obj, __s16 dev)
{
	struct obj_key k = { .obj = obj, .tgid = tgid };
	bpf_map_update_elem(&object_device, &k, &dev, BPF_ANY);
}

static __always_inline void set_thread_device(struct thread_state *t, __s16 dev)
{
	t->device = dev;
	t->device_known = dev >= 0;
}

/* In agent mode a process enters `traced` with its first event, so that its exit is seen. */
static __always_inline void note_traced(__u32 tgid)
{
	if (trace_all && !bpf_map_lookup_elem(&traced, &tgid)) {
		__u8 one = 1;
		bpf_map_update_elem(&traced, &tgid, &one, BPF_NOEXIST);
	}
}

/* CUmemAllocationProp and CUmemPoolProps both start {int type; int handleTypes; {int type; int id} location}. */
#define LOCATION_ID_OFFSET 12

static __always_inline int finish_call(struct pt_regs *ctx, __u32 fn)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (fn >= FN_COUNT)
		return 0;
	struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
	if (!t || !t->slot[fn].valid)
		return 0;
	/* Read in place (no copy): only this thread writes its slots. */
	struct call *c = &t->slot[fn];
	c->valid = 0;
	__s32 rc = (__s32)PT_REGS_RC(ctx);

	/* Device tracking: no event. */
	switch (fn) {
	case FN_PRIMARY_CTX_RETAIN: /* (CUcontext *pctx, CUdevice dev) */
		if (rc == 0)
			set_object_device(tgid, read_user_u64(c->arg[0]), (__s16)c->arg[1]);
		return 0;
	case FN_CTX_CREATE: /* (CUcontext *pctx, unsigned flags, CUdevice dev): the new context is current */
		if (rc == 0) {
			set_object_device(tgid, read_user_u64(c->arg[0]), (__s16)c->arg[2]);
			set_thread_device(t, (__s16)c->arg[2]);
		}
		return 0;
	case FN_CTX_SET_CURRENT: /* (CUcontext ctx) */
	case FN_CTX_PUSH_CURRENT:
		if (rc == 0)
			set_thread_device(t, c->arg[0] ? device_of_object(tgid, c->arg[0]) : -1);
		return 0;
	case FN_CTX_POP_CURRENT: /* the context below is not known here: forget */
		if (rc == 0)
			set_thread_device(t, -1);
		return 0;
	case FN_CTX_GET_DEVICE: /* (CUdevice *dev) */
		if (rc == 0)
			set_thread_device(t, (__s16)read_user_s32(c->arg[0]));
		return 0;
	case FN_POOL_CREATE: /* (CUmemoryPool *pool, const CUmemPoolProps *props) */
		if (rc == 0)
			set_object_device(tgid, read_user_u64(c->arg[0]), (__s16)read_user_s32(c->arg[1] + LOCATION_ID_OFFSET));
		return 0;
	case FN_DEFAULT_MEM_POOL: /* (CUmemoryPool *pool, CUdevice dev) */
		if (rc == 0) {
			__u64 pool = read_user_u64(c->arg[0]);
			struct obj_key dk = { .obj = c->arg[1], .tgid = tgid };
			set_object_device(tgid, pool, (__s16)c->arg[1]);
			bpf_map_update_elem(&device_pool, &dk, &pool, BPF_ANY);
			/* Also as the process's last pool looked up (obj = -1): the pool of an allocation
			 * from a thread whose device was never seen (PyTorch's autograd threads on the
			 * H200; exact for a process on one device). */
			dk.obj = (__u64)-1;
			bpf_map_update_elem(&device_pool, &dk, &pool, BPF_ANY);
		}
		return 0;
	default:
		break;
	}

	__u16 kind = 0;
	__s16 device = t->device_known ? t->device : -1;
	__u64 addr = 0, size = 0, requested = 0, handle = 0, stream = 0, device_free = 0;
	__u32 flags = GPUFRAG_F_SRC_EBPF;
	__u64 ts = 0;
	bool alloc = true;

	switch (fn) {
	case FN_MEM_ALLOC: /* (CUdeviceptr *dptr, size_t bytesize) */
		kind = GPUFRAG_EV_MEM_ALLOC;
		size = requested = c->arg[1];
		handle = c->caller; /* the owner's address rides in handle (caller_address in wire/src/event.rs) */
		if (rc == 0)
			addr = read_user_u64(c->arg[0]);
		break;
	case FN_MEM_ALLOC_MANAGED: /* (CUdeviceptr *dptr, size_t bytesize, unsigned flags) */
		kind = GPUFRAG_EV_MEM_ALLOC_MANAGED;
		size = requested = c->arg[1];
		handle = c->caller;
		if (rc == 0)
			addr = read_user_u64(c->arg[0]);
		break;
	case FN_MEM_ALLOC_PITCH: /* (CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem) */
		kind = GPUFRAG_EV_MEM_ALLOC_PITCH;
		handle = c->caller;
		requested = c->arg[2] * c->arg[3];
		size = requested;
		if (rc == 0) {
			addr = read_user_u64(c->arg[0]);
			size = read_user_u64(c->arg[1]) * c->arg[3];
		}
		break;
	case FN_ADDRESS_RESERVE: /* (CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, u64 flags) */
		kind = GPUFRAG_EV_ADDRESS_RESERVE;
		size = requested = c->arg[1];
		if (rc == 0)
			addr = read_user_u64(c->arg[0]);
		break;
	case FN_MEM_CREATE: /* (CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, u64 flags) */
		kind = GPUFRAG_EV_PHYS_CREATE;
		size = requested = c->arg[1];
		device = (__s16)read_user_s32(c->arg[2] + LOCATION_ID_OFFSET);
		stream = c->caller; /* a PhysCreate's owner address rides in stream */
		if (rc == 0)
			handle = read_user_u64(c->arg[0]);
		break;
	case FN_MEM_MAP: /* (CUdeviceptr ptr, size_t size, size_t offset, handle, u64 flags) */
		/* Mapping allocates nothing (cuMemCreate did): a failure is a refused argument, not an OOM. */
		alloc = false;
		kind = GPUFRAG_EV_MAP;
		addr = c->arg[0];
		size = c->arg[1];
		requested = c->arg[2];
		handle = c->arg[3];
		break;
	case FN_ALLOC_ASYNC: { /* (CUdeviceptr *dptr, size_t bytesize, CUstream s): the device's current pool */
		kind = GPUFRAG_EV_POOL_ALLOC;
		size = requested = c->arg[1];
		stream = c->arg[2];
		/* The pool, when the process asked for it (cuDeviceGetDefaultMemPool/cuDeviceGetMemPool); else 0. */
		struct obj_key dk = { .obj = (__u64)(__s64)device, .tgid = tgid };
		__u64 *pool = device >= 0 ? bpf_map_lookup_elem(&device_pool, &dk) : NULL;
		if (!pool) {
			dk.obj = (__u64)-1;
			pool = bpf_map_lookup_elem(&device_pool, &dk);
		}
		if (pool) {
			handle = *pool;
			if (device < 0)
				device = device_of_object(tgid, handle);
		}
		if (rc == 0)
			addr = read_user_u64(c->arg[0]);
		break;
	}
	case FN_ALLOC_FROM_POOL_ASYNC: { /* (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s) */
		kind = GPUFRAG_EV_POOL_ALLOC;
		size = requested = c->arg[1];
		handle = c->arg[2];
		stream = c->arg[3];
		__s16 pd = device_of_object(tgid, handle);
		if (pd >= 0)
			device = pd;
		if (rc == 0)
			addr = read_user_u64(c->arg[0]);
		break;
	}
	/* Frees are stamped with the time their call began: the driver may hand the address to
	 * another thread, whose allocation returns (and is reported) before this uretprobe runs.
	 * Entry time < the other allocation's return time always, so user space, which applies
	 * events in timestamp order (a short reorder window), sees the free first. */
	case FN_MEM_FREE: /* (CUdeviceptr) */
		alloc = false;
		kind = GPUFRAG_EV_MEM_FREE;
		addr = c->arg[0];
		device = -1; /* the consumer resolves a free by address */
		ts = c->entry_ns;
		break;
	case FN_ADDRESS_FREE: /* (CUdeviceptr ptr, size_t size) */
		alloc = false;
		kind = GPUFRAG_EV_ADDRESS_FREE;
		addr = c->arg[0];
		size = c->arg[1];
		device = -1;
		ts = c->entry_ns;
		break;
	case FN_MEM_RELEASE: /* (handle) */
		alloc = false;
		kind = GPUFRAG_EV_PHYS_RELEASE;
		handle = c->arg[0];
		device = -1;
		ts = c->entry_ns;
		break;
	case FN_MEM_UNMAP: /* (CUdeviceptr ptr, size_t size) */
		alloc = false;
		kind = GPUFRAG_EV_UNMAP;
		addr = c->arg[0];
		size = c->arg[1];
		device = -1;
		ts = c->entry_ns;
		break;
	case FN_FREE_ASYNC: /* (CUdeviceptr, CUstream) */
		alloc = false;
		kind = GPUFRAG_EV_POOL_FREE;
		addr = c->arg[0];
		stream = c->arg[1];
		device = -1;
		ts = c->entry_ns;
		break;
	case FN_POOL_TRIM_TO: { /* (CUmemoryPool pool, size_t minBytesToKeep) */
		alloc = false;
		kind = GPUFRAG_EV_POOL_TRIM;
		handle = c->arg[0];
		size = c->arg[1];
		__s16 pd = device_of_object(tgid, handle);
		if (pd >= 0)
			device = pd;
		break;
	}
	case FN_POOL_GET_ATTRIBUTE: { /* (CUmemoryPool pool, CUmemPool_attribute attr, void *value) */
		/* Only CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT (5), and only when the driver answered. */
		if (rc != 0 || (__s32)c->arg[1] != 5)
			return 0;
		alloc = false;
		kind = GPUFRAG_EV_POOL_RESERVED;
		handle = c->arg[0];
		size = read_user_u64(c->arg[2]);
		/* Stamped when the call began, before the driver read the figure: another thread's
		 * allocation that lands meanwhile is ordered after this sample and served from the
		 * cache it counts (the shim does the same). */
		ts = c->entry_ns;
		__s16 pd = device_of_object(tgid, handle);
		if (pd >= 0)
			device = pd;
		break;
	}
	case FN_MEM_GET_INFO: /* (size_t *free, size_t *total) */
		if (rc != 0)
			return 0;
		alloc = false;
		kind = GPUFRAG_EV_DEVICE_INFO;
		device_free = read_user_u64(c->arg[0]);
		size = read_user_u64(c->arg[1]);
		flags |= GPUFRAG_F_DEVICE_FREE_KNOWN;
		t->last_total = size;
		break;
	case FN_TORCH_MALLOC: /* NativeCachingAllocator::malloc(this, void **devPtr, int8 device, size_t size, CUstream) */
		if (rc == 0) { /* void: the register holds garbage; the out-pointer says whether it worked */
		}
		addr = read_user_u64(c->arg[1]);
		if (!addr)
			return 0;
		note_traced(tgid);
		struct gpufrag_event *b = reserve_event(id, GPUFRAG_EV_BLOCK_ALLOC, (__s8)c->arg[2], GPUFRAG_F_SRC_EBPF);
		if (!b)
			return 0;
		b->addr = addr;
		b->requested = c->arg[3];
		b->stream = c->arg[4];
		submit_event(b);
		return 0;
	case FN_BFC_ALLOC: /* tsl::BFCAllocator::AllocateRaw(this, size_t alignment, size_t num_bytes[, attrs]) -> void* */
	case FN_BFC_ALLOC_PLAIN: {
		__u64 ptr = (__u64)PT_REGS_RC(ctx);
		note_traced(tgid);
		/* The thread's device when known; else user space finds the map holding the address. */
		__s16 dev = t->device_known ? t->device : -1;
		struct gpufrag_event *b = reserve_event(id, ptr ? GPUFRAG_EV_BLOCK_ALLOC : GPUFRAG_EV_ALLOC_FAILED, dev,
							GPUFRAG_F_SRC_EBPF | GPUFRAG_F_ALLOC_XLA_BFC | (ptr ? 0 : GPUFRAG_F_FAILED));
		if (!b)
			return 0;
		b->addr = ptr;
		b->requested = c->arg[2];
		b->handle = c->arg[0]; /* the allocator: GPU_0_bfc and the host allocator are two */
		if (!ptr) {
			b->rc = 2; /* out of memory, in CUresult terms */
			b->op = GPUFRAG_EV_BLOCK_ALLOC;
		}
		submit_event(b);
		return 0;
	}
	case FN_TORCH_RAW_ALLOC: /* (this, size_t nbytes) -> void*, on the current stream */
	case FN_TORCH_RAW_ALLOC_STREAM: { /* (this, size_t nbytes, cudaStream_t) -> void* */
		__u64 ptr = (__u64)PT_REGS_RC(ctx);
		if (!ptr)
			return 0; /* a failure raised PyTorch's OOM, which its own probe reports */
		note_traced(tgid);
		/* The thread's device when known; else user space finds the map holding the address. */
		struct gpufrag_event *b = reserve_event(id, GPUFRAG_EV_BLOCK_ALLOC, t->device_known ? t->device : -1, GPUFRAG_F_SRC_EBPF);
		if (!b)
			return 0;
		b->addr = ptr;
		b->requested = c->arg[1];
		b->stream = fn == FN_TORCH_RAW_ALLOC_STREAM ? c->arg[2] : 0;
		submit_event(b);
		return 0;
	}
	case FN_TORCH_FRACTION: { /* -> PyObject* (NULL: it raised, nothing was set) */
		if (!PT_REGS_RC(ctx))
			return 0;
		note_traced(tgid);
		struct gpufrag_event *f = reserve_event(id, GPUFRAG_EV_MEMORY_FRACTION, (__s16)c->arg[3], GPUFRAG_F_SRC_EBPF);
		if (!f)
			return 0;
		f->handle = c->arg[2]; /* the fraction, an IEEE double's bits */
		f->size = t->last_total; /* the device total PyTorch multiplied it by (0: not seen) */
		submit_event(f);
		return 0;
	}
	default:
		return 0;
	}

	note_traced(tgid);
	bool failed = rc != 0;
	struct gpufrag_event *e = reserve_event_at(ts, id, failed && alloc ? GPUFRAG_EV_ALLOC_FAILED : kind, device,
						   flags | (failed ? GPUFRAG_F_FAILED : 0));
	if (!e)
		return 0;
	e->addr = addr;
	e->size = size;
	e->requested = requested;
	e->handle = handle;
	e->stream = stream;
	e->device_free = device_free;
	e->rc = rc;
	if (failed && alloc) {
		e->op = kind;
		submit_now(e);
		return 0;
	}
	submit_event(e);
	return 0;
}

#define PROBE_PAIR(name, fn)                                   \
	SEC("uprobe") int name##_entry(struct pt_regs *ctx)    \
	{                                                      \
		return save_call(ctx, fn);                     \
	}                                                      \
	SEC("uretprobe") int name##_return(struct pt_regs *ctx) \
	{                                                      \
		return finish_call(ctx, fn);                   \
	}

PROBE_PAIR(mem_alloc, FN_MEM_ALLOC)
PROBE_PAIR(mem_alloc_pitch, FN_MEM_ALLOC_PITCH)
PROBE_PAIR(mem_alloc_managed, FN_MEM_ALLOC_MANAGED)
PROBE_PAIR(mem_free, FN_MEM_FREE)
PROBE_PAIR(address_free, FN_ADDRESS_FREE)
PROBE_PAIR(mem_release, FN_MEM_RELEASE)
PROBE_PAIR(mem_unmap, FN_MEM_UNMAP)
PROBE_PAIR(free_async, FN_FREE_ASYNC)
PROBE_PAIR(address_reserve, FN_ADDRESS_RESERVE)
PROBE_PAIR(mem_create, FN_MEM_CREATE)
PROBE_PAIR(mem_map, FN_MEM_MAP)
PROBE_PAIR(alloc_async, FN_ALLOC_ASYNC)
PROBE_PAIR(alloc_from_pool_async, FN_ALLOC_FROM_POOL_ASYNC)
PROBE_PAIR(pool_trim_to, FN_POOL_TRIM_TO)
PROBE_PAIR(mem_get_info, FN_MEM_GET_INFO)
PROBE_PAIR(primary_ctx_retain, FN_PRIMARY_CTX_RETAIN)
PROBE_PAIR(ctx_set_current, FN_CTX_SET_CURRENT)
PROBE_PAIR(ctx_create, FN_CTX_CREATE)
PROBE_PAIR(ctx_push_current, FN_CTX_PUSH_CURRENT)
PROBE_PAIR(ctx_pop_current, FN_CTX_POP_CURRENT)
PROBE_PAIR(ctx_get_device, FN_CTX_GET_DEVICE)
PROBE_PAIR(pool_create, FN_POOL_CREATE)
PROBE_PAIR(default_mem_pool, FN_DEFAULT_MEM_POOL)
PROBE_PAIR(pool_get_attribute, FN_POOL_GET_ATTRIBUTE)
PROBE_PAIR(torch_malloc, FN_TORCH_MALLOC)

/* libcudart's cudaMalloc, cudaMallocPitch, cudaMalloc3D and cudaMallocManaged: no event of their
 * own (each ends in a probed driver call); they say who asked the runtime. The thread's depth
 * counts the runtime allocation calls it is inside; the outermost keeps its caller, so a runtime
 * that calls its own exported functions (cudaMalloc3D through cudaMallocPitch) still names the
 * application's code. A return with no entry seen (a call under way when the probe went in) is
 * ignored. */
SEC("uprobe") int runtime_alloc_entry(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_traced(id >> 32))
		return 0;
	struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t)
		return 0;
	if (t->rt_depth == 0)
		t->rt_caller = return_address(ctx);
	t->rt_depth += 1;
	return 0;
}
SEC("uretprobe") int runtime_alloc_return(struct pt_regs *ctx)
{
	struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
	if (!t || t->rt_depth == 0)
		return 0;
	t->rt_depth -= 1;
	if (t->rt_depth == 0)
		t->rt_caller = 0;
	return 0;
}

/* A block of PyTorch's caching allocator returns to the cache: a BlockFree of ptr, stamped at the
 * probed call's entry. */
static __always_inline int block_freed(__u64 ptr)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!ptr || !is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_BLOCK_FREE, -1, GPUFRAG_F_SRC_EBPF);
	if (!e)
		return 0;
	e->addr = ptr;
	submit_event(e);
	return 0;
}

/* Native::local_raw_delete(void *ptr): a block returns to the cache. */
SEC("uprobe") int torch_free_entry(struct pt_regs *ctx)
{
	return block_freed(PT_REGS_PARM1(ctx));
}

/* NativeCachingAllocator::raw_delete(this, void *ptr): a raw_alloc'd block returns to the cache
 * (it calls free() directly, not local_raw_delete, so neither the USDT probe nor local_raw_delete's
 * uprobe sees it). Stamped at entry, before another thread can be handed the same block. */
SEC("uprobe") int torch_raw_delete_entry(struct pt_regs *ctx)
{
	return block_freed(PT_REGS_PARM2(ctx));
}

/* raw_alloc(this, size) and raw_alloc_with_stream(this, size, stream): one block each. Should a
 * build have one call the other, only the outer call is saved, so its return reports the block
 * once (as the two overloads of BFC's AllocateRaw). */
static __always_inline int save_raw_alloc(struct pt_regs *ctx, __u32 fn, __u32 other)
{
	struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
	if (t && t->slot[other].valid)
		return 0;
	return save_call(ctx, fn);
}
SEC("uprobe") int torch_raw_alloc_entry(struct pt_regs *ctx)
{
	return save_raw_alloc(ctx, FN_TORCH_RAW_ALLOC, FN_TORCH_RAW_ALLOC_STREAM);
}
SEC("uretprobe") int torch_raw_alloc_return(struct pt_regs *ctx)
{
	return finish_call(ctx, FN_TORCH_RAW_ALLOC);
}
SEC("uprobe") int torch_raw_alloc_stream_entry(struct pt_regs *ctx)
{
	return save_raw_alloc(ctx, FN_TORCH_RAW_ALLOC_STREAM, FN_TORCH_RAW_ALLOC);
}
SEC("uretprobe") int torch_raw_alloc_stream_return(struct pt_regs *ctx)
{
	return finish_call(ctx, FN_TORCH_RAW_ALLOC_STREAM);
}

/* THCPModule_setMemoryFraction(PyObject *self, PyObject *args), in libtorch_python.so: what
 * torch.cuda.set_per_process_memory_fraction(fraction, device) calls once it has checked that the
 * fraction is a float in [0, 1] and made the device an index. args is a tuple (fraction, device):
 * CPython's layouts, stable across 3.8-3.14 (default builds): a tuple's items from byte 24, a
 * float's value at byte 16, an int's first 30-bit digit at byte 24 (a device index is one digit).
 * Read at entry (the objects are alive for the call); the event goes out at the return, with the
 * device total of the cuMemGetInfo PyTorch makes inside (allowed = fraction x that total). */
SEC("uprobe") int torch_fraction_entry(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_traced(id >> 32))
		return 0;
	struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t)
		return 0;
	__u64 args = PT_REGS_PARM2(ctx);
	__u64 fraction = read_user_u64(args + 24);
	__u64 device = read_user_u64(args + 32);
	struct call *c = &t->slot[FN_TORCH_FRACTION];
	c->arg[2] = read_user_u64(fraction + 16);
	c->arg[3] = (__u64)(read_user_s32(device + 24) & 0x3fffffff);
	c->entry_ns = 0;
	c->valid = fraction && device;
	t->last_total = 0;
	return 0;
}
SEC("uretprobe") int torch_fraction_return(struct pt_regs *ctx)
{
	return finish_call(ctx, FN_TORCH_FRACTION);
}

/* c10::reportOutOfMemoryToProfiler(long alloc_size, size_t total_allocated, size_t total_reserved,
 * c10::Device device), in libc10.so: PyTorch's caching allocator calls it on every OOM it raises
 * (DeviceCachingAllocator::malloc, after its last try and before its OOM observers and the
 * throw), with the rounded request and its own allocated and reserved bytes. c10::Device is two
 * int8 (type, index) in one register; only CUDA devices (type 1) are reported. */
SEC("uprobe") int torch_oom_entry(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_traced(id >> 32))
		return 0;
	__u64 dev = PT_REGS_PARM4(ctx);
	if ((dev & 0xff) != 1)
		return 0;
	note_traced(id >> 32);
	__s8 index = (__s8)((dev >> 8) & 0xff);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_ALLOC_FAILED, index, GPUFRAG_F_SRC_EBPF | GPUFRAG_F_FAILED | GPUFRAG_F_ALLOCATOR_OOM);
	if (!e)
		return 0;
	e->requested = PT_REGS_PARM1(ctx);
	e->handle = PT_REGS_PARM3(ctx);
	e->rc = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	e->op = GPUFRAG_EV_BLOCK_ALLOC;
	submit_now(e);
	return 0;
}

/* tsl::BFCAllocator::AllocateRaw(this, alignment, num_bytes, const AllocationAttributes&). Not
 * saved when the thread is inside the 2-argument overload, whose return reports the call. */
SEC("uprobe") int bfc_alloc_entry(struct pt_regs *ctx)
{
	struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
	if (t && t->slot[FN_BFC_ALLOC_PLAIN].valid)
		return 0;
	return save_call(ctx, FN_BFC_ALLOC);
}
SEC("uretprobe") int bfc_alloc_return(struct pt_regs *ctx)
{
	return finish_call(ctx, FN_BFC_ALLOC);
}
PROBE_PAIR(bfc_alloc_plain, FN_BFC_ALLOC_PLAIN)

/* tsl::BFCAllocator::DeallocateRaw(this, void *ptr): the chunk returns to the pool. Stamped at
 * entry, before another thread can be handed the same chunk. */
SEC("uprobe") int bfc_free_entry(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 ptr = PT_REGS_PARM2(ctx);
	if (!ptr || !is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_BLOCK_FREE, -1, GPUFRAG_F_SRC_EBPF | GPUFRAG_F_ALLOC_XLA_BFC);
	if (!e)
		return 0;
	e->addr = ptr;
	e->handle = PT_REGS_PARM1(ctx);
	submit_event(e);
	return 0;
}

/* USDT pytorch:malloc(ptr, device, size, stream), fired after the block is chosen. */
SEC("usdt") int BPF_USDT(usdt_malloc, void *ptr, long device, long size, void *stream)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!ptr || !is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_BLOCK_ALLOC, (__s8)device, GPUFRAG_F_SRC_USDT);
	if (!e)
		return 0;
	e->addr = (__u64)ptr;
	e->requested = (__u64)size;
	e->stream = (__u64)stream;
	submit_event(e);
	return 0;
}

/* USDT pytorch:free(ptr). */
SEC("usdt") int BPF_USDT(usdt_free, void *ptr)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!ptr || !is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_BLOCK_FREE, -1, GPUFRAG_F_SRC_USDT);
	if (!e)
		return 0;
	e->addr = (__u64)ptr;
	submit_event(e);
	return 0;
}

/* include/gpufrag_annotate.h: a caching allocator's own announcements (USDT provider gpufrag),
 * the same events the shim makes of its gpufrag_annotate_* functions. */
static __always_inline __s16 announced_device(long device)
{
	return device >= 0 && device < 32768 ? (__s16)device : -1;
}

/* The allocator field (bits 16-19 of the flags) for an annotation's allocator id, its probe's last
 * argument: 0 (the default) outside 1-15. A probe built before the argument existed has fewer
 * arguments, and libbpf reads a missing one as 0: the default allocator. gpufrag_wire's
 * event::allocator_field is the same rule. */
static __always_inline __u32 allocator_field(long allocator)
{
	return allocator >= 1 && allocator <= GPUFRAG_ALLOC_ID_MAX ? (__u32)allocator << GPUFRAG_ALLOC_ID_SHIFT : 0;
}

/* gpufrag:segment(addr, device, allocator): the allocator owns the segment holding addr. */
SEC("usdt") int BPF_USDT(gf_segment, long addr, long device, long allocator)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_ADOPT, announced_device(device), GPUFRAG_F_SRC_USDT | allocator_field(allocator));
	if (!e)
		return 0;
	e->addr = (__u64)addr;
	submit_event(e);
	return 0;
}

/* gpufrag:block_alloc(addr, size, requested, device, allocator) */
SEC("usdt") int BPF_USDT(gf_block_alloc, long addr, long size, long requested, long device, long allocator)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!addr || !is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	__u32 flags = GPUFRAG_F_SRC_USDT | allocator_field(allocator) | (size > 0 ? GPUFRAG_F_BLOCK_SIZE_KNOWN : 0);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_BLOCK_ALLOC, announced_device(device), flags);
	if (!e)
		return 0;
	e->addr = (__u64)addr;
	e->size = size > 0 ? (__u64)size : 0;
	e->requested = (__u64)requested;
	submit_event(e);
	return 0;
}

/* gpufrag:block_free(addr, device) */
SEC("usdt") int BPF_USDT(gf_block_free, long addr, long device)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!addr || !is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_BLOCK_FREE, announced_device(device), GPUFRAG_F_SRC_USDT);
	if (!e)
		return 0;
	e->addr = (__u64)addr;
	submit_event(e);
	return 0;
}

/* gpufrag:oom(requested, device_free, device, allocator): the allocator's request failed for good. */
SEC("usdt") int BPF_USDT(gf_oom, long requested, long device_free, long device, long allocator)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_traced(id >> 32))
		return 0;
	note_traced(id >> 32);
	bool known = device_free != -1;
	__u32 flags = GPUFRAG_F_SRC_USDT | GPUFRAG_F_FAILED | allocator_field(allocator) | (known ? GPUFRAG_F_DEVICE_FREE_KNOWN : 0);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_ALLOC_FAILED, announced_device(device), flags);
	if (!e)
		return 0;
	e->requested = (__u64)requested;
	e->device_free = known ? (__u64)device_free : 0;
	e->rc = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	e->op = GPUFRAG_EV_BLOCK_ALLOC;
	submit_now(e);
	return 0;
}

/* Kernel types, as CO-RE flavours: only the fields read, relocated against the kernel's BTF. */
struct signal_struct___gpufrag {
	struct {
		int counter;
	} live;
} __attribute__((preserve_access_index));

struct task_struct___gpufrag {
	int pid;
	int tgid;
	struct signal_struct___gpufrag *signal;
} __attribute__((preserve_access_index));

/* Mappings of CUDA libraries not yet probed, for user space to probe at once rather than at its
 * next /proc scan: a kprobe on security_mmap_file, or do_mmap where that cannot be probed (every
 * file mmap, the dynamic loader's included; the file is the first argument of both) passes on those whose file name starts with libcuda.so, libc10_cuda.so or libcudart and whose
 * (device, inode) is not in probed_files (user space adds each file it probes). */
struct file_key {
	__u64 ino;
	__u32 dev; /* the kernel's dev_t: major << 20 | minor */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct file_key);
	__type(value, __u8);
} probed_files SEC(".maps");

#define LIB_NAME_LEN 48

struct lib_mapped {
	__u64 ino; /* 0 with dev 0: the dynamic loader's breakpoint, no file (on_dl_debug_state) */
	__u32 dev;
	__u32 pid;
	char name[LIB_NAME_LEN];
	__u64 ts_ns; /* bpf_ktime_get_ns, the clock of the events */
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} lib_maps SEC(".maps");

struct lib_mapped lib_mapped_dummy = {}; /* makes the skeleton carry the type */

struct qstr___gpufrag {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry___gpufrag {
	struct qstr___gpufrag d_name;
} __attribute__((preserve_access_index));

struct path___gpufrag {
	struct dentry___gpufrag *dentry;
} __attribute__((preserve_access_index));

struct super_block___gpufrag {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode___gpufrag {
	unsigned long i_ino;
	struct super_block___gpufrag *i_sb;
} __attribute__((preserve_access_index));

struct file___gpufrag {
	struct path___gpufrag f_path;
	struct inode___gpufrag *f_inode;
} __attribute__((preserve_access_index));

static __always_inline bool starts_with(const char *s, const char *prefix, int n)
{
	for (int i = 0; i < n; i++)
		if (s[i] != prefix[i])
			return false;
	return true;
}

SEC("kprobe")
int on_mmap_file(struct pt_regs *ctx)
{
	struct file___gpufrag *file = (void *)PT_REGS_PARM1(ctx);
	if (!file)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_traced(id >> 32))
		return 0;
	char name[LIB_NAME_LEN] = {};
	const unsigned char *np = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	if (bpf_probe_read_kernel_str(name, sizeof(name), np) <= 0)
		return 0;
	if (!starts_with(name, "libcuda.so", 10) && !starts_with(name, "libc10_cuda.so", 14) && !starts_with(name, "libcudart", 9))
		return 0;
	struct file_key k = {};
	k.ino = BPF_CORE_READ(file, f_inode, i_ino);
	k.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
	if (bpf_map_lookup_elem(&probed_files, &k))
		return 0;
	struct lib_mapped *m = bpf_ringbuf_reserve(&lib_maps, sizeof(*m), 0);
	if (!m)
		return 0;
	m->ino = k.ino;
	m->dev = k.dev;
	m->pid = id >> 32;
	m->ts_ns = bpf_ktime_get_ns();
	__builtin_memcpy(m->name, name, sizeof(name));
	bpf_ringbuf_submit(m, BPF_RB_FORCE_WAKEUP);
	return 0;
}

/* The dynamic loader's breakpoint: glibc's and musl's ld.so call _dl_debug_state (the r_debug
 * r_brk function debuggers put a breakpoint on) when a dlopen starts mapping objects (RT_ADD) and
 * again once they are mapped and before their initializers run (RT_CONSISTENT). A uprobe on it
 * tells user space that a process's mappings changed, so that a CUDA library it loaded is probed
 * within milliseconds rather than at the next /proc scan. No file is named (ino 0): user space
 * reads the process's maps. */
SEC("uprobe")
int on_dl_debug_state(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_traced(id >> 32))
		return 0;
	struct lib_mapped *m = bpf_ringbuf_reserve(&lib_maps, sizeof(*m), 0);
	if (!m)
		return 0;
	m->ino = 0;
	m->dev = 0;
	m->pid = id >> 32;
	m->ts_ns = bpf_ktime_get_ns();
	m->name[0] = 0;
	bpf_ringbuf_submit(m, BPF_RB_FORCE_WAKEUP);
	return 0;
}

/* sched_process_fork(parent, child): a child of a traced process is traced from its start. */
SEC("raw_tp/sched_process_fork")
int on_fork(struct bpf_raw_tracepoint_args *ctx)
{
	if (!follow_children || trace_all)
		return 0;
	struct task_struct___gpufrag *parent = (void *)ctx->args[0];
	struct task_struct___gpufrag *child = (void *)ctx->args[1];
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	if (ptgid == ctgid || !bpf_map_lookup_elem(&traced, &ptgid))
		return 0;
	__u8 one = 1;
	bpf_map_update_elem(&traced, &ctgid, &one, BPF_ANY);
	struct gpufrag_event *e = reserve_event(((__u64)ctgid << 32) | ctgid, GPUFRAG_EV_PROCESS_EXEC, -1, GPUFRAG_F_SRC_EBPF);
	if (!e)
		return 0;
	e->handle = ptgid; /* the parent, for user space */
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* sched_process_exec: a traced process replaced its image; its CUDA state is gone. */
struct linux_binprm___gpufrag {
	struct file___gpufrag *file;
} __attribute__((preserve_access_index));

/* Agent mode: an executable file user space has not looked at yet is reported (it may carry
 * gpufrag's annotation USDT probes); user space adds every file it looked at to probed_files. */
static __always_inline void report_new_exe(struct bpf_raw_tracepoint_args *ctx, __u32 tgid)
{
	struct linux_binprm___gpufrag *bprm = (void *)ctx->args[2];
	struct file___gpufrag *file = BPF_CORE_READ(bprm, file);
	if (!file)
		return;
	struct file_key k = {};
	k.ino = BPF_CORE_READ(file, f_inode, i_ino);
	k.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
	if (bpf_map_lookup_elem(&probed_files, &k))
		return;
	struct lib_mapped *m = bpf_ringbuf_reserve(&lib_maps, sizeof(*m), 0);
	if (!m)
		return;
	m->ino = k.ino;
	m->dev = k.dev;
	m->pid = tgid;
	m->ts_ns = bpf_ktime_get_ns();
	const unsigned char *np = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	if (bpf_probe_read_kernel_str(m->name, sizeof(m->name), np) <= 0)
		m->name[0] = 0;
	bpf_ringbuf_submit(m, BPF_RB_FORCE_WAKEUP);
}

SEC("raw_tp/sched_process_exec")
int on_exec(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (trace_all)
		report_new_exe(ctx, tgid);
	if (!bpf_map_lookup_elem(&traced, &tgid))
		return 0;
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_PROCESS_EXEC, -1, GPUFRAG_F_SRC_EBPF);
	if (!e)
		return 0;
	e->rc = 1; /* 1: an exec of a process already traced (user space drops its old image's state) */
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* sched_process_exit: runs for every exiting thread; the last one (signal->live == 0) ends the process. */
SEC("raw_tp/sched_process_exit")
int on_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!bpf_map_lookup_elem(&traced, &tgid))
		return 0;
	struct task_struct___gpufrag *task = (void *)bpf_get_current_task();
	int live = BPF_CORE_READ(task, signal, live.counter);
	if (live != 0)
		return 0;
	bpf_map_delete_elem(&traced, &tgid);
	/* A later process with this pid must not inherit the last pool looked up. */
	struct obj_key last_pool = { .obj = (__u64)-1, .tgid = tgid };
	bpf_map_delete_elem(&device_pool, &last_pool);
	struct gpufrag_event *e = reserve_event(id, GPUFRAG_EV_PROCESS_EXIT, -1, GPUFRAG_F_SRC_EBPF | GPUFRAG_F_COMM);
	if (!e)
		return 0;
	/* The name of a process that may be gone before user space reads /proc (16 bytes over addr
	 * and size, which an exit does not use). */
	bpf_get_current_comm(&e->addr, 16);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* The benchmark's baseline: an empty uprobe and uretprobe pair. */
SEC("uprobe") int empty_entry(struct pt_regs *ctx)
{
	return 0;
}

SEC("uretprobe") int empty_return(struct pt_regs *ctx)
{
	return 0;
}
