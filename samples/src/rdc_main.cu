// A kernel calling device code of another translation unit (rdc_device.cu), as CMake's
// separable compilation builds it: -rdc=true and a device link.
#include "common.h"

extern __device__ unsigned rdc_calls;
extern __device__ float weight(int i, int period);

__global__ void weigh(const float *in, float *out, int n, int period, int rounds) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = in[i];
  for (int r = 0; r < rounds; ++r) acc = acc * 0.5f + weight(i + r, period);
  out[i] = acc;
}

int main() {
  const int n = 1 << 16;
  float *h = (float *)malloc(n * sizeof(float)), *d_in, *d_out;
  fill_uniform(h, n, 7);
  CHECK(cudaMalloc(&d_in, n * sizeof(float)));
  CHECK(cudaMalloc(&d_out, n * sizeof(float)));
  CHECK(cudaMemcpy(d_in, h, n * sizeof(float), cudaMemcpyHostToDevice));
  for (int rounds = 4; rounds <= 8; rounds += 4) {
    weigh<<<(n + 255) / 256, 256>>>(d_in, d_out, n, 13, rounds);
    CHECK_LAUNCH();
  }
  CHECK(cudaMemcpy(h, d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
  unsigned calls = 0;
  CHECK(cudaMemcpyFromSymbol(&calls, rdc_calls, sizeof calls));
  print_checksum("weigh", h, n * sizeof(float));
  print_checksum("rdc_calls", &calls, sizeof calls);
  return 0;
}
