// A stand-in for the part of PyTorch's c10/cuda/CUDACachingAllocator.h that gpufrag's trace
// tracker (python/torch_tracker.cpp) uses, with the same names, field names and Action order
// as PyTorch 2.11 (c10/core/CachingDeviceAllocator.h): CI has no PyTorch, so the tracker's real
// source is compiled against this and driven by standin_c10_cuda.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

namespace c10 {
using DeviceIndex = int8_t;
namespace cuda::CUDACachingAllocator {
struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM };
  Action action_;
  c10::DeviceIndex device_;
  size_t addr_;
  void* stream_{};
  size_t size_;
};
using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;
void attachAllocatorTraceTracker(AllocatorTraceTracker tracker);
}  // namespace cuda::CUDACachingAllocator
}  // namespace c10
