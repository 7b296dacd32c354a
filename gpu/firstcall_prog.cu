// gpu/validate_firstcall.sh's C++ program: links the CUDA runtime, allocates in its first
// millisecond and announces its blocks through include/gpufrag_annotate.h (one 64 MiB segment
// carved into four 8 MiB blocks, one freed), then prints its own figures as one JSON line.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "gpufrag_annotate.h"

static double ms_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

int main(void) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const uint64_t seg = 64ull << 20, blk = 8ull << 20;
  void *p = 0;
  cudaError_t rc = cudaMalloc(&p, seg);
  double first_ms = ms_since(&t0);
  if (rc != cudaSuccess) {
    fprintf(stderr, "cudaMalloc: %s\n", cudaGetErrorString(rc));
    return 1;
  }
  uint64_t base = (uint64_t)p;
  gpufrag_announce_segment(base, 0);
  for (int i = 0; i < 4; i++) gpufrag_announce_block_alloc(base + i * blk, blk, blk - 4096, 0);
  gpufrag_announce_block_free(base + 1 * blk, 0);
  printf("{\"pid\": %d, \"first_alloc_ms\": %.3f, \"reserved\": %llu, \"allocated\": %llu, \"blocks\": 3}\n", (int)getpid(), first_ms,
         (unsigned long long)seg, (unsigned long long)(3 * blk));
  fflush(stdout);
  sleep(2);
  return 0;
}
