// Launch paths real apps use beyond <<<>>>: a kernel with no parameters launched with NULL
// arguments, dynamic shared memory above the 48 KiB default (which needs
// cudaFuncAttributeMaxDynamicSharedMemorySize on the function), a cache preference, and an
// attribute set after the kernel's first launch. Each result is printed as a checksum.
#include "common.h"

__device__ unsigned long long g_ticks[256];

__global__ void no_params() {  // launched as cudaLaunchKernel(f, grid, block, NULL, 0, stream)
  atomicAdd(&g_ticks[threadIdx.x], threadIdx.x * 3ull + blockIdx.x);  // both blocks: integer atomics, one result
}

// Sums `per_block` floats per block through a dynamic shared buffer of that size.
__global__ void staged_sum(const float *x, float *out, int per_block, int rounds) {
  extern __shared__ float stage[];
  const float *mine = x + (size_t)blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) stage[i] = mine[i];
  __syncthreads();
  float acc = 0.f;
  for (int r = 0; r < rounds; ++r)
    for (int i = threadIdx.x; i < per_block; i += blockDim.x) acc += stage[(i + r) % per_block] * (r + 1);
  out[blockIdx.x * blockDim.x + threadIdx.x] += acc;  // one slot per thread: no atomics, same bits every run
}

int main() {
  // (1) no parameters, NULL arguments
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaLaunchKernel((const void *)no_params, dim3(2), dim3(256), nullptr, 0, nullptr));
    CHECK_LAUNCH();
  }
  unsigned long long ticks[256];
  CHECK(cudaMemcpyFromSymbol(ticks, g_ticks, sizeof ticks));
  print_checksum("no_params", ticks, sizeof ticks);

  // (2) 80,000 bytes of dynamic shared memory: 20,000 floats per block
  const int blocks = 64, per_block = 20000;
  const size_t shmem = per_block * sizeof(float);
  float *hx = (float *)malloc((size_t)blocks * per_block * sizeof(float));
  for (size_t i = 0; i < (size_t)blocks * per_block; ++i) hx[i] = (float)((i * 2654435761u) % 1000) / 1000.f;
  float *dx, *dout;
  CHECK(cudaMalloc(&dx, (size_t)blocks * per_block * sizeof(float)));
  CHECK(cudaMalloc(&dout, blocks * 256 * sizeof(float)));
  CHECK(cudaMemcpy(dx, hx, (size_t)blocks * per_block * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dout, 0, blocks * 256 * sizeof(float)));
  staged_sum<<<blocks, 256, 8000>>>(dx, dout, 2000, 2);  // first launch: under 48 KiB, no attribute yet
  CHECK_LAUNCH();
  // set after the first launch, when a variant may already exist: it must get it too
  CHECK(cudaFuncSetAttribute(staged_sum, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
  CHECK(cudaFuncSetCacheConfig(staged_sum, cudaFuncCachePreferShared));
  for (int i = 0; i < 5; ++i) {
    staged_sum<<<blocks, 256, shmem>>>(dx, dout, per_block, 3);
    CHECK_LAUNCH();
  }
  static float out[blocks * 256];
  CHECK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
  print_checksum("staged_sum", out, sizeof out);
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dout));
  free(hx);
  return 0;
}
