// Dynamic parallelism (nvcc -rdc=true, the device runtime linked): a parent kernel launches a
// child kernel from the GPU. The device runtime's PTX is for a newer architecture than sm_90.
#include "common.h"

__global__ void child(float *v, int n, float a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = v[i] * a + 1.0f;
}

__global__ void parent(float *v, int n, int rounds) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    for (int r = 0; r < rounds; ++r) child<<<(n + 255) / 256, 256>>>(v, n, 0.5f);
}

int main() {
  const int n = 1 << 14;
  float *h = (float *)malloc(n * sizeof(float)), *d;
  fill_uniform(h, n, 3);
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
  parent<<<1, 32>>>(d, n, 3);
  CHECK_LAUNCH();
  child<<<(n + 255) / 256, 256>>>(d, n, 2.0f);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
  print_checksum("cdp", h, n * sizeof(float));
  return 0;
}
