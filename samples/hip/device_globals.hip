// HIP port of samples/src/device_globals.cu.
// Kernels that read and write a __device__ global and read a __constant__ one. A JIT
// kernel must use the very same variables as the original (AOT) module: the checksum
// covers the device-side counter and table, written by one kernel and read by another.
#include "common.h"

__device__ unsigned int hits;     // written by accumulate, read back by the host
__device__ float table[256];      // written by accumulate, read by apply
__constant__ float coeffs[4];     // set by the host with hipMemcpyToSymbol

__global__ void accumulate(const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (in[i] > 0.0f) atomicAdd(&hits, 1u);
  // Exactly one writer per slot: deterministic.
  if (i < 256) table[i] = in[i] * coeffs[3] + (float)i;
}

__global__ void apply(float *out, const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float t = table[i & 255];
  out[i] = coeffs[0] + coeffs[1] * in[i] + coeffs[2] * t + (float)(hits & 7u);
}

int main() {
  const int n = 1 << 20;
  static float in[n], out[n];
  fill_uniform(in, n, 7);
  const float c[4] = {0.5f, -1.25f, 2.0f, 3.0f};
  CHECK(hipMemcpyToSymbol(HIP_SYMBOL(coeffs), c, sizeof(c)));
  unsigned int zero = 0;
  CHECK(hipMemcpyToSymbol(HIP_SYMBOL(hits), &zero, sizeof(zero)));
  float *din = to_device(in, n), *dout = to_device(out, n);
  accumulate<<<(n + 255) / 256, 256>>>(din, n);
  CHECK_LAUNCH();
  apply<<<(n + 255) / 256, 256>>>(dout, din, n);
  CHECK_LAUNCH();
  unsigned int h = 0;
  static float t[256];
  CHECK(hipMemcpyFromSymbol(&h, HIP_SYMBOL(hits), sizeof(h)));
  CHECK(hipMemcpyFromSymbol(t, HIP_SYMBOL(table), sizeof(t)));
  to_host(out, dout, n);
  printf("hits %u\n", h);
  print_checksum("table", t, sizeof(t));
  print_checksum("apply", out, sizeof(out));
  CHECK(hipFree(din)); CHECK(hipFree(dout));
  return 0;
}
