// Launch overhead: many launches of an almost empty kernel. Prints the host time spent in
// the launch calls themselves: launches go in batches of 256 (well under the queue depth,
// so a launch never waits for the GPU), and only the batches are timed, not the
// synchronization after each.
#include "common.h"
#include <chrono>
#include <cstring>

__global__ void tiny(int *out, int value) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = value;
}

int main(int argc, char **argv) {
  int launches = argc > 1 ? atoi(argv[1]) : 100000;
  int *d;
  CHECK(cudaMalloc(&d, sizeof(int)));
  for (int i = 0; i < 100; ++i) tiny<<<1, 32>>>(d, 7);  // warm-up (and, under the shim, compile)
  CHECK_LAUNCH();
  double total_ns = 0;
  for (int done = 0; done < launches;) {
    int batch = launches - done < 256 ? launches - done : 256;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) tiny<<<1, 32>>>(d, 7);
    auto t1 = std::chrono::steady_clock::now();
    total_ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
    CHECK_LAUNCH();
    done += batch;
  }
  double ns = total_ns / launches;
  int h = 0;
  CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
  printf("launches %d ns_per_launch %.1f value %d\n", launches, ns, h);
  printf("checksum tiny %016llx\n", (unsigned long long)fnv1a(&h, sizeof h));
  CHECK(cudaFree(d));
  return 0;
}
