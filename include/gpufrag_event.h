/* gpufrag_event.h: the one wire format of gpufrag.
 *
 * Every capture source (the LD_PRELOAD shim, the eBPF probes, the snapshot importer) produces this
 * fixed-size record and everything downstream consumes only it. The Rust twin is
 * `gpufrag_wire::event::Event` (wire/src/event.rs, re-exported as `gpufrag::event`);
 * tests/event_layout.rs compiles this header and fails if the size, a field offset, a kind or a
 * flag bit differs. Change both together, never one.
 */
#ifndef GPUFRAG_EVENT_H
#define GPUFRAG_EVENT_H

#ifdef __BPF__
/* BPF programs get the fixed-width types from vmlinux.h or <linux/types.h>. */
#else
#include <stdint.h>
typedef uint64_t __u64;
typedef uint32_t __u32;
typedef uint16_t __u16;
typedef int32_t __s32;
typedef int16_t __s16;
#endif

enum gpufrag_event_kind {
	GPUFRAG_EV_INVALID = 0,
	GPUFRAG_EV_MEM_ALLOC = 1,          /* cuMemAlloc / cudaMalloc: addr, size */
	GPUFRAG_EV_MEM_ALLOC_PITCH = 2,    /* cuMemAllocPitch / cudaMallocPitch / cudaMalloc3D: addr, size = pitch * height */
	GPUFRAG_EV_MEM_ALLOC_MANAGED = 3,  /* cuMemAllocManaged / cudaMallocManaged: addr, size */
	GPUFRAG_EV_MEM_FREE = 4,           /* cuMemFree / cudaFree: addr */
	GPUFRAG_EV_ADDRESS_RESERVE = 5,    /* cuMemAddressReserve: addr, size */
	GPUFRAG_EV_ADDRESS_FREE = 6,       /* cuMemAddressFree: addr, size */
	GPUFRAG_EV_PHYS_CREATE = 7,        /* cuMemCreate: handle, size */
	GPUFRAG_EV_PHYS_RELEASE = 8,       /* cuMemRelease: handle */
	GPUFRAG_EV_MAP = 9,                /* cuMemMap: addr, size, handle, requested = offset into handle */
	GPUFRAG_EV_UNMAP = 10,             /* cuMemUnmap: addr, size */
	GPUFRAG_EV_POOL_ALLOC = 11,        /* cuMemAllocAsync / cuMemAllocFromPoolAsync: addr, size, handle = pool, stream */
	GPUFRAG_EV_POOL_FREE = 12,         /* cuMemFreeAsync: addr, stream */
	GPUFRAG_EV_POOL_TRIM = 13,         /* cuMemPoolTrimTo: handle = pool, size = minBytesToKeep */
	GPUFRAG_EV_BLOCK_ALLOC = 14,       /* framework block: addr, requested (size = block size when the source knows it, else 0) */
	GPUFRAG_EV_BLOCK_FREE = 15,        /* framework block freed: addr */
	GPUFRAG_EV_ALLOC_FAILED = 16,      /* failed allocation: requested, rc, device_free (flag), op = the kind that failed */
	GPUFRAG_EV_DEVICE_INFO = 17,       /* device totals: size = total, device_free */
	GPUFRAG_EV_PROCESS_EXEC = 18,      /* a traced process started (or exec'd): pid */
	GPUFRAG_EV_PROCESS_EXIT = 19,      /* a traced process ended: pid */
	GPUFRAG_EV_DROPPED = 20,           /* the source dropped `size` events before this one */
	GPUFRAG_EV_POOL_RESERVED = 21,     /* a stream-ordered pool's reserved bytes as the driver reports them: handle = pool, size */
	GPUFRAG_EV_ADOPT = 22,             /* a caching allocator claims the segment holding addr (addr 0: manages the process's memory) */
	GPUFRAG_EV_RECORD_END = 23,        /* the end of a record file (never on a ring): its writer stopped cleanly */
	GPUFRAG_EV_ALLOC_SETTINGS = 24,    /* a process's allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax) in the text: at start, each change */
	GPUFRAG_EV_MEMORY_FRACTION = 25,   /* set_per_process_memory_fraction on device: size = allowed bytes, text = the fraction */
	GPUFRAG_EV_FRAMEWORK_INFO = 26,    /* the framework managing the process's memory: flags = its allocator, text = name and version */
	GPUFRAG_EV_FRAMEWORK_FIGURES = 27, /* a framework's figures at its OOM: size = pool, requested = in use, handle = largest free chunk */
	GPUFRAG_EV_FORECAST = 28,          /* gpufrag's forecast of a process's peak: size = predicted peak, requested = available, handle = steps ahead (0 fits), addr = steps simulated, text = fix */
	GPUFRAG_EV_DEVICE_UUID = 32,       /* the driver's UUID of CUDA ordinal device: bytes 0..8 in addr, 8..16 in size (big-endian) */
	GPUFRAG_EV_IPC_EXPORT = 40,        /* cuIpcGetMemHandle / cudaIpcGetMemHandle of the allocation holding addr; rc */
	GPUFRAG_EV_KIND_COUNT = 41,        /* one past the largest kind (kinds may leave gaps: a number is never reused) */
};

/* flags */
#define GPUFRAG_F_DEVICE_FREE_KNOWN (1u << 0) /* device_free holds a measured value */
#define GPUFRAG_F_SRC_SHIM          (1u << 1)
#define GPUFRAG_F_SRC_EBPF          (1u << 2)
#define GPUFRAG_F_SRC_SNAPSHOT      (1u << 3)
#define GPUFRAG_F_SRC_USDT          (1u << 4)
#define GPUFRAG_F_BLOCK_SIZE_KNOWN  (1u << 5) /* a block event's size is the block's real extent */
#define GPUFRAG_F_FAILED            (1u << 6) /* the call returned rc != 0 */
#define GPUFRAG_F_FRAMEWORK_OWNED   (1u << 7) /* a segment or mapping made by a framework's caching allocator */
#define GPUFRAG_F_ALLOC_XLA_BFC     (1u << 8) /* block/adopt: XLA's BFC allocator (neither bit: PyTorch's) */
#define GPUFRAG_F_ALLOC_CUPY        (1u << 9) /* block/adopt: CuPy's memory pool */
#define GPUFRAG_F_SRC_NVML          (1u << 10) /* DEVICE_INFO read from NVML (pid != 0: for that process's failed allocation) */
#define GPUFRAG_F_COMM              (1u << 11) /* PROCESS_EXIT from eBPF: addr and size hold the process's comm (16 bytes, NUL-padded) */
#define GPUFRAG_F_ALLOCATOR_OOM     (1u << 12) /* ALLOC_FAILED from PyTorch's own OOM path (reportOutOfMemoryToProfiler); handle = its reserved bytes */
#define GPUFRAG_F_ALLOWED_KNOWN     (1u << 13) /* ALLOC_FAILED: size = the allocator's allowed bytes (memory fraction) */
#define GPUFRAG_F_OOM_AMEND         (1u << 14) /* ALLOC_FAILED that only gives its allowed bytes to its process's latest allocator OOM */
#define GPUFRAG_F_PARTIAL           (1u << 15) /* PROCESS_EXEC: first seen after its start or probed late: what it did before is missing */
#define GPUFRAG_F_OWNER_KNOWN       (1u << 20) /* MEM_ALLOC*, PHYS_CREATE: op = the owner (wire/src/owner.rs); the caller's return address in handle (MEM_ALLOC*) or stream (PHYS_CREATE) */
/* block, adopt, ALLOC_FAILED of an allocator: bits 16-19 = the allocator's place in gpufrag's
 * table (src/alloc/mod.rs REGISTRY; the GPUFRAG_ALLOCATOR_* ids of gpufrag_annotate.h), 0 = none */
#define GPUFRAG_ALLOC_ID_SHIFT      16
#define GPUFRAG_ALLOC_ID_MAX        15

struct gpufrag_event {
	__u64 ts_ns;       /* CLOCK_MONOTONIC (live) or the trace's own clock (import) */
	__u64 addr;        /* device address, 0 when none */
	__u64 size;        /* bytes (see the kind) */
	__u64 requested;   /* the size the caller asked for; MAP: offset into the handle */
	__u64 handle;      /* CUmemGenericAllocationHandle, or CUmemoryPool */
	__u64 stream;      /* CUstream, 0 = legacy default */
	__u64 device_free; /* bytes free on the device when known (GPUFRAG_F_DEVICE_FREE_KNOWN) */
	__u32 pid;
	__u32 tid;
	__u16 kind;        /* enum gpufrag_event_kind */
	__s16 device;      /* CUDA ordinal; -1 when unknown */
	__s32 rc;          /* CUresult / cudaError_t of the call, 0 = success */
	__u32 flags;       /* GPUFRAG_F_* */
	__u16 op;          /* ALLOC_FAILED: the kind of the call that failed */
	__u16 text_len;    /* bytes of text after the event in a record file; 0 on a ring */
};

#ifndef __BPF__
_Static_assert(sizeof(struct gpufrag_event) == 80, "gpufrag_event must stay 80 bytes");
#endif

#endif /* GPUFRAG_EVENT_H */
