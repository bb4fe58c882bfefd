// Launch overhead: many launches of an almost empty kernel. Prints the wall time per launch
// (launches are queued asynchronously; the total includes one final synchronization).
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
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) tiny<<<1, 32>>>(d, 7);
  CHECK_LAUNCH();
  auto t1 = std::chrono::steady_clock::now();
  double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / launches;
  int h = 0;
  CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
  printf("launches %d ns_per_launch %.1f value %d\n", launches, ns, h);
  printf("checksum tiny %016llx\n", (unsigned long long)fnv1a(&h, sizeof h));
  CHECK(cudaFree(d));
  return 0;
}
