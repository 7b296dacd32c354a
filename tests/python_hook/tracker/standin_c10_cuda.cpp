// A stand-in libc10_cuda.so for the trace tracker tests: it keeps the attached trace trackers and
// calls them, as PyTorch's caching allocator does under its lock, for each entry the test's
// workload hands it (standin_trace). Built by tests/run_torch_tracker.rs.
#include <c10/cuda/CUDACachingAllocator.h>

#include <vector>

namespace A = c10::cuda::CUDACachingAllocator;

static std::vector<A::AllocatorTraceTracker> trackers;

void A::attachAllocatorTraceTracker(AllocatorTraceTracker tracker) {
  trackers.push_back(std::move(tracker));
}

// One trace entry to every attached tracker; returns how many there are.
extern "C" int standin_trace(int action, uint64_t addr, uint64_t size, uint64_t stream, int device) {
  A::TraceEntry te{static_cast<A::TraceEntry::Action>(action), static_cast<c10::DeviceIndex>(device), static_cast<size_t>(addr),
                   reinterpret_cast<void*>(static_cast<uintptr_t>(stream)), static_cast<size_t>(size)};
  for (auto& t : trackers) {
    t(te);
  }
  return static_cast<int>(trackers.size());
}
