/* cuda_prog.c: a CUDA driver client for gpufrag's eBPF tests. It dlopens libcuda.so.1 (the
 * simcuda stand-in in CI, the real driver elsewhere), calls the exported driver functions that
 * the uprobes watch, and prints its own figures ("FIGURES key=value ...") for the tests to
 * compare with what the trace reconstructs.
 *
 * usage: cuda_prog SCENARIO [ARG]
 *   basic            plain allocations, every other one freed
 *   vmm              reserve, create, map, unmap, release
 *   async            stream-ordered allocations from the default pool, then a trim to 0
 *   devices          thread A on device 0, thread B on device 1 (SIMCUDA_DEVICES=2)
 *   threads N        4 threads x N alloc/free pairs of 1 MiB
 *   oom              a request larger than the device fails (CUDA_ERROR_OUT_OF_MEMORY)
 *   wait FILE        allocate 3 segments, wait until FILE exists, allocate 2 more, exit
 *   oomhold HOLD REQ FILE  allocate HOLD MiB, ask for REQ MiB (fails when more than is free),
 *                    print the free memory cuMemGetInfo gave at the failure, wait until FILE
 *                    exists, exit (the OOM is seen while the process still holds its memory)
 *   gate FILE SCENARIO [ARG]  wait until FILE exists before touching CUDA at all, then SCENARIO
 *   torch LIB        blocks from the fake libc10_cuda.so at LIB inside one 20 MiB segment
 *   dlopen LIB MS [LINGER]  the same, LIB loaded after the process started, its blocks MS ms
 *                    after (0: at once), then LINGER ms before exiting
 *   segdlopen LIB MS the segment first, then LIB loaded, its blocks MS ms after
 *   torchoom LIB MODE  a 4 MiB block in a 20 MiB segment, then PyTorch's OOM report (the fake
 *                    libc10.so beside LIB) for a 30 MiB request: MODE limit reports it with no
 *                    driver call (a memory fraction's cap refused it; the fraction set through the
 *                    fake libtorch_python.so, whose setter calls cuMemGetInfo as PyTorch before 2.9
 *                    does; MODE limitlazy: it multiplies a total read before, as 2.9 and later),
 *                    MODE driver after a failed
 *                    cuMemAlloc_v2 of the same request; a CPU-side report too, which is no GPU OOM
 *   xla LIB          chunks from the fake XLA BFC allocator at LIB (xla_cuda_plugin.so) inside one
 *                    64 MiB preallocated pool (one VMM mapping, as JAX's), ending with a
 *                    fragmentation OOM inside the pool; a second BFC instance over host memory
 *   bench N          N alloc+free pairs of 4 KiB; prints ns per pair
 *   fork             parent allocates 2 MiB, its child allocates 4 MiB, both exit
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
	int type, requestedHandleTypes;
	struct { int type, id; } location;
	void *win32HandleMetaData;
	struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { struct { int type, id; } location; int flags; } CUmemAccessDesc;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree_v2)(CUdeviceptr);
static CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
static CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
static CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
static CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
static CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
static CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
static CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
static CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
static CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, int);
static CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
static CUresult (*cuStreamSynchronize)(void *);
static CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);

#define MIB (1ull << 20)

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p) {
		fprintf(stderr, "cuda_prog: no %s\n", name);
		exit(3);
	}
	return p;
}

static void check(CUresult rc, const char *what)
{
	if (rc) {
		fprintf(stderr, "cuda_prog: %s failed: %d\n", what, rc);
		exit(4);
	}
}

static void load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		fprintf(stderr, "cuda_prog: %s\n", dlerror());
		exit(2);
	}
	cuInit = sym(h, "cuInit");
	cuDevicePrimaryCtxRetain = sym(h, "cuDevicePrimaryCtxRetain");
	cuCtxSetCurrent = sym(h, "cuCtxSetCurrent");
	cuMemAlloc_v2 = sym(h, "cuMemAlloc_v2");
	cuMemFree_v2 = sym(h, "cuMemFree_v2");
	cuMemAddressReserve = sym(h, "cuMemAddressReserve");
	cuMemAddressFree = sym(h, "cuMemAddressFree");
	cuMemCreate = sym(h, "cuMemCreate");
	cuMemRelease = sym(h, "cuMemRelease");
	cuMemMap = sym(h, "cuMemMap");
	cuMemUnmap = sym(h, "cuMemUnmap");
	cuMemSetAccess = sym(h, "cuMemSetAccess");
	cuMemAllocAsync = sym(h, "cuMemAllocAsync");
	cuMemFreeAsync = sym(h, "cuMemFreeAsync");
	cuDeviceGetDefaultMemPool = sym(h, "cuDeviceGetDefaultMemPool");
	cuMemPoolTrimTo = sym(h, "cuMemPoolTrimTo");
	cuStreamSynchronize = sym(h, "cuStreamSynchronize");
	cuMemGetInfo_v2 = sym(h, "cuMemGetInfo_v2");
	check(cuInit(0), "cuInit");
}

static void use_device(int dev)
{
	CUcontext ctx;
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

static void wait_for(const char *path)
{
	struct stat st;
	while (stat(path, &st) != 0)
		usleep(10000);
}

static void basic(void)
{
	/* Sizes that need no rounding rule to agree on: multiples of 2 MiB, and one small one. */
	static const size_t sizes[] = { 2 * MIB, 4 * MIB, 6 * MIB, 20 * MIB, 2 * MIB, 8 * MIB, 64 * MIB, 2 * MIB };
	CUdeviceptr p[8];
	unsigned long long live = 0;
	int n = 8, frees = 0;
	for (int i = 0; i < n; i++)
		check(cuMemAlloc_v2(&p[i], sizes[i]), "cuMemAlloc_v2");
	for (int i = 0; i < n; i += 2) {
		check(cuMemFree_v2(p[i]), "cuMemFree_v2");
		frees++;
	}
	for (int i = 1; i < n; i += 2)
		live += sizes[i];
	size_t free_b, total;
	check(cuMemGetInfo_v2(&free_b, &total), "cuMemGetInfo_v2");
	printf("FIGURES device=0 reserved=%llu segments=%d allocs=%d frees=%d\n", live, n / 2, n, frees);
}

static void vmm(void)
{
	CUdeviceptr va;
	CUmemGenericAllocationHandle h[3];
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
	prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
	prop.location.id = 0;
	check(cuMemAddressReserve(&va, 64 * MIB, 0, 0, 0), "cuMemAddressReserve");
	for (int i = 0; i < 3; i++)
		check(cuMemCreate(&h[i], 4 * MIB, &prop, 0), "cuMemCreate");
	for (int i = 0; i < 3; i++)
		check(cuMemMap(va + i * 4 * MIB, 4 * MIB, 0, h[i], 0), "cuMemMap");
	CUmemAccessDesc acc = { { 1, 0 }, 3 };
	check(cuMemSetAccess(va, 12 * MIB, &acc, 1), "cuMemSetAccess");
	check(cuMemUnmap(va + 8 * MIB, 4 * MIB), "cuMemUnmap");
	check(cuMemRelease(h[2]), "cuMemRelease");
	printf("FIGURES device=0 reserved=%llu segments=1 allocs=3 frees=0\n", 8 * MIB);
}

static void async_pool(void)
{
	CUmemoryPool pool;
	CUdeviceptr p[6];
	check(cuDeviceGetDefaultMemPool(&pool, 0), "cuDeviceGetDefaultMemPool");
	for (int i = 0; i < 6; i++)
		check(cuMemAllocAsync(&p[i], 4 * MIB, 0), "cuMemAllocAsync");
	for (int i = 0; i < 6; i += 2)
		check(cuMemFreeAsync(p[i], 0), "cuMemFreeAsync");
	check(cuStreamSynchronize(0), "cuStreamSynchronize");
	check(cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo");
	printf("FIGURES device=0 reserved=%llu segments=3 allocs=6 frees=3\n", 12 * MIB);
}

static int pairs = 100;

static void *thread_main(void *arg)
{
	use_device((int)(intptr_t)arg);
	for (int i = 0; i < pairs; i++) {
		CUdeviceptr p;
		check(cuMemAlloc_v2(&p, MIB), "cuMemAlloc_v2");
		check(cuMemFree_v2(p), "cuMemFree_v2");
	}
	return NULL;
}

static void *device_thread(void *arg)
{
	int dev = (int)(intptr_t)arg;
	CUdeviceptr p;
	use_device(dev);
	check(cuMemAlloc_v2(&p, (dev + 1) * 10 * MIB), "cuMemAlloc_v2");
	return NULL;
}

static void devices(void)
{
	pthread_t t[2];
	for (int d = 0; d < 2; d++) {
		pthread_create(&t[d], NULL, device_thread, (void *)(intptr_t)d);
		pthread_join(t[d], NULL);
	}
	printf("FIGURES device=0 reserved=%llu segments=1\n", 10 * MIB);
	printf("FIGURES device=1 reserved=%llu segments=1\n", 20 * MIB);
}

static void threads(void)
{
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, thread_main, (void *)0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	printf("FIGURES device=0 reserved=0 allocs=%d frees=%d\n", 4 * pairs, 4 * pairs);
}

static void oom(void)
{
	CUdeviceptr p, q;
	check(cuMemAlloc_v2(&p, 64 * MIB), "cuMemAlloc_v2");
	CUresult rc = cuMemAlloc_v2(&q, 1ull << 50);
	printf("OOM rc=%d requested=%llu\n", rc, 1ull << 50);
	printf("FIGURES device=0 reserved=%llu segments=1\n", 64 * MIB);
	/* Keep the 64 MiB half a second after the failure, as a program reporting its OOM does: the
	 * test checks the NVML read made at the failure, which a process already in its exit path
	 * (memory back on the device, not yet a zombie) would race on a loaded machine. */
	fflush(stdout);
	usleep(500 * 1000);
}

static void wait_scenario(const char *file)
{
	CUdeviceptr p;
	for (int i = 0; i < 3; i++)
		check(cuMemAlloc_v2(&p, 8 * MIB), "cuMemAlloc_v2");
	printf("READY\n");
	fflush(stdout);
	wait_for(file);
	for (int i = 0; i < 2; i++)
		check(cuMemAlloc_v2(&p, 2 * MIB), "cuMemAlloc_v2");
	printf("FIGURES device=0 reserved=%llu before=%llu after=%llu\n", 28 * MIB, 24 * MIB, 4 * MIB);
}

static void oom_hold(unsigned long long hold, unsigned long long req, const char *file)
{
	CUdeviceptr p, q;
	size_t free_b, total;
	check(cuMemAlloc_v2(&p, hold * MIB), "cuMemAlloc_v2");
	CUresult rc = cuMemAlloc_v2(&q, req * MIB);
	check(cuMemGetInfo_v2(&free_b, &total), "cuMemGetInfo_v2");
	printf("OOM rc=%d requested=%llu device_free=%llu\n", rc, req * MIB, (unsigned long long)free_b);
	printf("FIGURES device=0 reserved=%llu segments=1\n", hold * MIB);
	printf("READY\n");
	fflush(stdout);
	wait_for(file);
}

static void *open_lib(const char *lib)
{
	void *h = dlopen(lib, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "cuda_prog: %s\n", dlerror());
		exit(2);
	}
	return h;
}

/* The blocks of the torch scenario from the fake libc10_cuda.so `h`, in the segment `seg`
 * (allocated here when 0). */
static void torch_blocks(void *h, CUdeviceptr seg)
{
	void (*set_base)(unsigned long long) = sym(h, "fake_set_base");
	void *(*fmalloc)(unsigned long, signed char) = sym(h, "fake_malloc");
	void (*ffree)(void *) = sym(h, "fake_free");
	if (!seg)
		check(cuMemAlloc_v2(&seg, 20 * MIB), "cuMemAlloc_v2");
	set_base(seg);
	/* 3 blocks of 4 MiB, 2 MiB, 1 MiB + 1; the middle one freed. */
	void *a = fmalloc(4 * MIB, 0);
	void *b = fmalloc(2 * MIB, 0);
	void *c = fmalloc(MIB + 1, 0);
	ffree(b);
	(void)a;
	(void)c;
	/* Through the raw entry points (CUB's temporary storage, workspaces): 3 MiB kept, 1 MiB on
	 * a stream freed. */
	void *(*raw_alloc)(unsigned long, int) = sym(h, "fake_raw_alloc");
	void (*raw_free)(void *) = sym(h, "fake_raw_free");
	void *r = raw_alloc(3 * MIB, 0);
	void *rs = raw_alloc(MIB, 1);
	raw_free(rs);
	(void)r;
	printf("FIGURES device=0 reserved=%llu blocks=3 requested=%llu\n", 20 * MIB, 8 * MIB + 1);
}

static void torch(const char *lib)
{
	torch_blocks(open_lib(lib), 0);
}

static unsigned long long mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* dlopen LIB MS: the fake libc10_cuda.so is loaded after the process started (as `import torch`
 * loads PyTorch's), then after MS milliseconds (0: at once) the torch scenario's segment and
 * blocks. segdlopen LIB MS: the segment first, then the load, then the blocks MS later. */
static void torch_dlopen(const char *lib, int ms, int segment_first, int linger_ms)
{
	CUdeviceptr seg = 0;
	if (segment_first)
		check(cuMemAlloc_v2(&seg, 20 * MIB), "cuMemAlloc_v2");
	unsigned long long t0 = mono_ns();
	void *h = open_lib(lib);
	unsigned long long t1 = mono_ns();
	if (ms > 0)
		usleep((useconds_t)ms * 1000);
	torch_blocks(h, seg);
	printf("LOADED dlopen_start_ns=%llu dlopen_end_ns=%llu first_block_ns=%llu\n", t0, t1, mono_ns());
	fflush(stdout);
	if (linger_ms > 0)
		usleep((useconds_t)linger_ms * 1000);
}

static void torch_oom(const char *lib, const char *mode)
{
	void *h = dlopen(lib, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "cuda_prog: %s\n", dlerror());
		exit(2);
	}
	/* libc10.so lies beside libc10_cuda.so, as in torch/lib. */
	char c10[4096];
	const char *slash = strrchr(lib, '/');
	int dir = slash ? (int)(slash - lib) + 1 : 0;
	snprintf(c10, sizeof(c10), "%.*slibc10.so", dir, lib);
	void *hc = dlopen(c10, RTLD_NOW);
	if (!hc) {
		fprintf(stderr, "cuda_prog: %s\n", dlerror());
		exit(2);
	}
	void (*set_base)(unsigned long long) = sym(h, "fake_set_base");
	void *(*fmalloc)(unsigned long, signed char) = sym(h, "fake_malloc");
	void (*report)(long, unsigned long, unsigned long, signed char) = sym(hc, "fake_report_oom");
	/* libtorch_python.so too: set_per_process_memory_fraction(0.0025, 0) in limit mode. */
	char tp[4096];
	snprintf(tp, sizeof(tp), "%.*slibtorch_python.so", dir, lib);
	void *ht = dlopen(tp, RTLD_NOW);
	if (!ht) {
		fprintf(stderr, "cuda_prog: %s\n", dlerror());
		exit(2);
	}
	void (*report_cpu)(long) = sym(hc, "fake_report_cpu_oom");
	CUdeviceptr seg, q;
	check(cuMemAlloc_v2(&seg, 20 * MIB), "cuMemAlloc_v2");
	set_base(seg);
	(void)fmalloc(4 * MIB, 0);
	report_cpu(MIB);
	if (!strcmp(mode, "limit") || !strcmp(mode, "limitlazy")) {
		/* CPython's objects: a tuple (fraction, device) of a float and a small int. */
		struct { long refcnt; void *type; double value; } fraction = { 1, 0, 0.0025 };
		struct { long refcnt; void *type; unsigned long tag; unsigned int digit[1]; } device = { 1, 0, 1 << 3, { 0 } };
		struct { long refcnt; void *type; long size; void *items[2]; } args = { 1, 0, 2, { &fraction, &device } };
		void (*init)(CUresult (*)(size_t *, size_t *)) = sym(ht, "fake_torch_python_init");
		void *(*set_fraction)(void *, void *) = sym(ht, "_Z28THCPModule_setMemoryFractionP7_objectS0_");
		unsigned long (*allowed)(void) = sym(ht, "fake_allowed");
		size_t f0, t0;
		if (!strcmp(mode, "limit")) {
			init(cuMemGetInfo_v2);
		} else {
			/* As PyTorch 2.9 and later: the total read once before, none inside the setter;
			 * the program reads the device afterwards (torch.cuda.mem_get_info). */
			void (*set_total)(unsigned long) = sym(ht, "fake_torch_python_set_total");
			check(cuMemGetInfo_v2(&f0, &t0), "cuMemGetInfo_v2");
			set_total(t0);
		}
		if (!set_fraction(0, &args)) {
			fprintf(stderr, "cuda_prog: setMemoryFraction failed\n");
			exit(2);
		}
		if (strcmp(mode, "limit"))
			check(cuMemGetInfo_v2(&f0, &t0), "cuMemGetInfo_v2");
		printf("FRACTION allowed=%lu\n", allowed());
	}
	unsigned long long want = 30 * MIB;
	if (!strcmp(mode, "driver")) {
		CUresult rc = cuMemAlloc_v2(&q, 1ull << 50);
		printf("DRIVER rc=%d\n", rc);
		want = 1ull << 50;
	}
	report((long)want, 4 * MIB, 20 * MIB, 0);
	printf("OOM requested=%llu\n", want);
	printf("FIGURES device=0 reserved=%llu blocks=1 requested=%llu\n", 20 * MIB, 4 * MIB);
	fflush(stdout);
	/* Keep the memory while NVML is read for the failure. */
	usleep(500000);
}

static void xla(const char *lib)
{
	void *h = dlopen(lib, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "cuda_prog: %s\n", dlerror());
		exit(2);
	}
	void (*init)(unsigned long, unsigned long) = sym(h, "fake_bfc_init");
	void *(*alloc)(unsigned long) = sym(h, "fake_bfc_alloc");
	void *(*alloc_plain)(unsigned long) = sym(h, "fake_bfc_alloc_plain");
	void (*bfree)(void *) = sym(h, "fake_bfc_free");
	void (*stats)(unsigned long *, unsigned long *, unsigned long *) = sym(h, "fake_bfc_stats");
	void (*host_init)(unsigned long, unsigned long) = sym(h, "fake_host_bfc_init");
	void *(*host_alloc)(unsigned long) = sym(h, "fake_host_bfc_alloc");
	void (*host_free)(void *) = sym(h, "fake_host_bfc_free");
	/* JAX's preallocated pool: one VMM mapping (reserve, create, map), as on the H200 */
	CUdeviceptr pool;
	CUmemGenericAllocationHandle ph;
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = 1;          /* CU_MEM_ALLOCATION_TYPE_PINNED */
	prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
	check(cuMemAddressReserve(&pool, 64 * MIB, 0, 0, 0), "cuMemAddressReserve");
	check(cuMemCreate(&ph, 64 * MIB, &prop, 0), "cuMemCreate");
	check(cuMemMap(pool, 64 * MIB, 0, ph, 0), "cuMemMap");
	CUmemAccessDesc acc = { { 1, 0 }, 3 };
	check(cuMemSetAccess(pool, 64 * MIB, &acc, 1), "cuMemSetAccess");
	init(pool, 64 * MIB);
	/* the second instance, over host memory no driver call traced: its chunks are not counted */
	static char host_region[1 << 20] __attribute__((aligned(4096)));
	host_init((unsigned long)host_region, sizeof(host_region));
	void *h1 = host_alloc(4);
	void *h2 = host_alloc(100000);
	host_free(h1);
	void *a = alloc(8 * MIB);
	void *b = alloc(3 * MIB + 1);      /* rounded to 3 MiB + 256 */
	void *c = alloc(1000);             /* 1024 */
	void *d = alloc_plain(20 * MIB);   /* through the 2-argument overload */
	void *g = alloc(16 * MIB);
	bfree(b);
	void *e = alloc(MIB);              /* best fit: b's hole, split */
	void *f = alloc(MIB + MIB / 2);    /* the 2 MiB + 256 rest: under twice the request, taken whole */
	bfree(a);
	void *x = alloc(20 * MIB);         /* 25 MiB free, at most 17 MiB in one chunk: fails */
	if (x)
		fprintf(stderr, "cuda_prog: the fragmented pool served 20 MiB\n");
	(void)c; (void)d; (void)g; (void)e; (void)f; (void)h2;
	unsigned long in_use, largest, bytes;
	stats(&in_use, &largest, &bytes);
	/* The pool holds live chunks and never goes back to the driver: its free bytes are stranded. */
	printf("FIGURES device=0 reserved=%lu bfc_bytes_in_use=%lu bfc_largest_free_block=%lu bfc_pool_bytes=%lu bfc_stranded=%lu host_chunks=2 host_base=%lu\n",
	       bytes, in_use, largest, bytes, bytes - in_use, (unsigned long)host_region);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void bench(int n)
{
	CUdeviceptr p;
	for (int i = 0; i < 100; i++) { /* warm up */
		check(cuMemAlloc_v2(&p, 4096), "cuMemAlloc_v2");
		check(cuMemFree_v2(p), "cuMemFree_v2");
	}
	double t0 = now_s();
	for (int i = 0; i < n; i++) {
		check(cuMemAlloc_v2(&p, 4096), "cuMemAlloc_v2");
		check(cuMemFree_v2(p), "cuMemFree_v2");
	}
	double t1 = now_s();
	printf("BENCH pairs=%d ns_per_pair=%.0f\n", n, (t1 - t0) * 1e9 / n);
}

static void fork_scenario(void)
{
	CUdeviceptr p;
	check(cuMemAlloc_v2(&p, 2 * MIB), "cuMemAlloc_v2");
	fflush(stdout);
	pid_t c = fork();
	if (c == 0) {
		use_device(0);
		check(cuMemAlloc_v2(&p, 4 * MIB), "cuMemAlloc_v2 (child)");
		printf("CHILD pid=%d\n", getpid());
		fflush(stdout);
		_exit(0);
	}
	int st;
	waitpid(c, &st, 0);
	printf("FIGURES device=0 reserved=%llu child=%d\n", 2 * MIB, c);
}

int main(int argc, char **argv)
{
	if (argc > 2 && !strcmp(argv[1], "gate")) {
		wait_for(argv[2]);
		argv += 2;
		argc -= 2;
	}
	/* setenv NAME=VALUE: the program changes its own environment before its first CUDA call
	 * (what /proc/PID/environ and the shim's hello never see). */
	while (argc > 2 && !strcmp(argv[1], "setenv")) {
		char *eq = strchr(argv[2], '=');
		if (eq) {
			*eq = 0;
			setenv(argv[2], eq + 1, 1);
		}
		argv += 2;
		argc -= 2;
	}
	const char *s = argc > 1 ? argv[1] : "basic";
	load();
	use_device(0);
	if (!strcmp(s, "basic"))
		basic();
	else if (!strcmp(s, "vmm"))
		vmm();
	else if (!strcmp(s, "async"))
		async_pool();
	else if (!strcmp(s, "devices"))
		devices();
	else if (!strcmp(s, "threads")) {
		if (argc > 2)
			pairs = atoi(argv[2]);
		threads();
	} else if (!strcmp(s, "oom"))
		oom();
	else if (!strcmp(s, "wait"))
		wait_scenario(argv[2]);
	else if (!strcmp(s, "oomhold") && argc > 4)
		oom_hold(strtoull(argv[2], 0, 10), strtoull(argv[3], 0, 10), argv[4]);
	else if (!strcmp(s, "torch"))
		torch(argv[2]);
	else if ((!strcmp(s, "dlopen") || !strcmp(s, "segdlopen")) && argc > 3)
		torch_dlopen(argv[2], atoi(argv[3]), s[0] == 's', argc > 4 ? atoi(argv[4]) : 0);
	else if (!strcmp(s, "torchoom") && argc > 3)
		torch_oom(argv[2], argv[3]);
	else if (!strcmp(s, "xla"))
		xla(argv[2]);
	else if (!strcmp(s, "bench"))
		bench(argc > 2 ? atoi(argv[2]) : 10000);
	else if (!strcmp(s, "fork"))
		fork_scenario();
	else {
		fprintf(stderr, "cuda_prog: unknown scenario %s\n", s);
		return 1;
	}
	fflush(stdout);
	return 0;
}
