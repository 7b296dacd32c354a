// gpufrag's PyTorch trace tracker: event-level PyTorch blocks under `gpufrag run`, without root.
//
// A plain shared library (no Python extension, no pybind11, no ninja): the Python start-up hook
// compiles it once per torch version, CUDA version and source hash with the system C++ compiler
// against torch's headers, caches it (XDG_CACHE_HOME/gpufrag), loads it with ctypes and calls
// gpufrag_torch_tracker_attach() right after CUDA's lazy initialisation, before the first block
// is handed out. From then on PyTorch's caching allocator calls the tracker under its own lock
// for every trace entry (history recording stays off), and torch_trace.h turns each entry into
// one lock-free event in the calling thread's lane of the shim: O(1) per allocation, ordered
// against the driver calls the allocator makes, with no snapshot.
#include <c10/cuda/CUDACachingAllocator.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>

#include "torch_trace.h"

namespace A = c10::cuda::CUDACachingAllocator;

static_assert(static_cast<int>(A::TraceEntry::ALLOC) == GPUFRAG_TE_ALLOC, "TraceEntry::ALLOC moved");
static_assert(static_cast<int>(A::TraceEntry::FREE_REQUESTED) == GPUFRAG_TE_FREE_REQUESTED, "TraceEntry::FREE_REQUESTED moved");
static_assert(static_cast<int>(A::TraceEntry::FREE_COMPLETED) == GPUFRAG_TE_FREE_COMPLETED, "TraceEntry::FREE_COMPLETED moved");
static_assert(static_cast<int>(A::TraceEntry::SEGMENT_ALLOC) == GPUFRAG_TE_SEGMENT_ALLOC, "TraceEntry::SEGMENT_ALLOC moved");
static_assert(static_cast<int>(A::TraceEntry::OOM) == GPUFRAG_TE_OOM, "TraceEntry::OOM moved");

static gpufrag_shim_calls calls;
static std::atomic<uint64_t> entries{0};
static std::atomic<bool> stopped{false};

// 1: attached; 0: attached before; -1: the shim's annotation functions are not loaded (not under
// `gpufrag run`); -2: PyTorch refused the tracker (an exception, e.g. another allocator backend).
extern "C" int gpufrag_torch_tracker_attach(void) {
  static std::atomic<bool> attached{false};
  if (attached.load()) {
    return 0;
  }
  calls.block_alloc_on_stream = reinterpret_cast<decltype(calls.block_alloc_on_stream)>(dlsym(RTLD_DEFAULT, "gpufrag_annotate_block_alloc_on_stream"));
  calls.block_free = reinterpret_cast<decltype(calls.block_free)>(dlsym(RTLD_DEFAULT, "gpufrag_annotate_block_free"));
  calls.oom = reinterpret_cast<decltype(calls.oom)>(dlsym(RTLD_DEFAULT, "gpufrag_annotate_oom"));
  if (!calls.block_alloc_on_stream || !calls.block_free || !calls.oom) {
    return -1;
  }
  try {
    A::attachAllocatorTraceTracker([](const A::TraceEntry& te) {
      if (stopped.load(std::memory_order_relaxed)) {
        return;
      }
      entries.fetch_add(1, std::memory_order_relaxed);
      gpufrag_trace_entry(&calls, static_cast<int>(te.action_), static_cast<uint64_t>(te.addr_), static_cast<uint64_t>(te.size_),
                          static_cast<uint64_t>(reinterpret_cast<uintptr_t>(te.stream_)), static_cast<int>(te.device_));
    });
  } catch (...) {
    return -2;
  }
  attached.store(true);
  return 1;
}

// Trace entries seen so far (for the hook's own checks and the GPU validation).
extern "C" uint64_t gpufrag_torch_tracker_entries(void) {
  return entries.load(std::memory_order_relaxed);
}

// Stops forwarding entries (the hook calls it from its exit handler, the last one to run): the
// frees of the interpreter's teardown are left out, so the figures are the ones at exit, which
// memory_stats() and a final snapshot report.
extern "C" void gpufrag_torch_tracker_stop(void) {
  stopped.store(true);
}
