// fake_c10.cpp: a stand-in libc10.so exporting PyTorch's out-of-memory report,
// c10::reportOutOfMemoryToProfiler(long, unsigned long, unsigned long, c10::Device), with the
// same mangled name (_ZN3c1027reportOutOfMemoryToProfilerElmmNS_6DeviceE) and the same argument
// passing: three integers and c10::Device (two int8, type and index) in one register. PyTorch's
// caching allocator calls it on every OOM it raises, with the rounded request and its own
// allocated and reserved bytes.
namespace c10 {

enum class DeviceType : signed char { CPU = 0, CUDA = 1 };

struct Device {
	DeviceType type_;
	signed char index_;
	Device(DeviceType t, signed char i) : type_(t), index_(i) {}
};

__attribute__((visibility("default"), noinline)) void reportOutOfMemoryToProfiler(long alloc_size, unsigned long total_allocated, unsigned long total_reserved, Device device)
{
	asm volatile("" : : "r"(alloc_size), "r"(total_allocated), "r"(total_reserved), "r"(device.index_) : "memory");
}

} // namespace c10

// What the caching allocator does at an OOM on CUDA device `device`.
extern "C" __attribute__((visibility("default"))) void fake_report_oom(long rounded, unsigned long allocated, unsigned long reserved, signed char device)
{
	c10::reportOutOfMemoryToProfiler(rounded, allocated, reserved, c10::Device(c10::DeviceType::CUDA, device));
}

// A CPU-side report (PyTorch's CPU allocators call it too): not a GPU OOM.
extern "C" __attribute__((visibility("default"))) void fake_report_cpu_oom(long size)
{
	c10::reportOutOfMemoryToProfiler(size, 0, 0, c10::Device(c10::DeviceType::CPU, -1));
}
