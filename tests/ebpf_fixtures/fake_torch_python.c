/* fake_torch_python.c: a stand-in libtorch_python.so with torch._C._cuda_setMemoryFraction's C
 * function, THCPModule_setMemoryFraction(PyObject *self, PyObject *args), under its mangled name
 * (_Z28THCPModule_setMemoryFractionP7_objectS0_). Its argument is laid out as CPython lays out a
 * tuple of a float and an int (items from byte 24; a float's value at byte 16; an int's first
 * digit at byte 24), and it does what PyTorch's allocator does with it: cuMemGetInfo, then
 * allowed = (size_t)(fraction * total). The test program builds the objects and checks the
 * allowed bytes the trace gives against the ones computed here. */
typedef int (*mem_get_info_fn)(unsigned long *, unsigned long *);

struct object {
	long refcnt;
	void *type;
};
struct tuple {
	long refcnt;
	void *type;
	long size;
	struct object *items[2];
};
struct pyfloat {
	long refcnt;
	void *type;
	double value;
};

static mem_get_info_fn mem_get_info;
static unsigned long device_total;
static unsigned long allowed;

/* PyTorch before 2.9: the setter calls cuMemGetInfo for the total. */
void fake_torch_python_init(mem_get_info_fn f)
{
	mem_get_info = f;
}

/* PyTorch 2.9 and later: the setter multiplies by the device's totalGlobalMem, read once before
 * (no driver call inside). */
void fake_torch_python_set_total(unsigned long total)
{
	device_total = total;
}

unsigned long fake_allowed(void)
{
	return allowed;
}

void *set_memory_fraction(struct object *self, struct tuple *args) __asm__("_Z28THCPModule_setMemoryFractionP7_objectS0_");

__attribute__((noinline)) void *set_memory_fraction(struct object *self, struct tuple *args)
{
	double fraction = ((struct pyfloat *)args->items[0])->value;
	unsigned long free_b = 0, total = device_total;
	if (mem_get_info && mem_get_info(&free_b, &total) != 0)
		return 0; /* CPython: an exception is set, NULL returned */
	allowed = (unsigned long)(fraction * (double)total);
	__asm__ volatile("" : : "r"(self) : "memory");
	return args; /* CPython: Py_None */
}
