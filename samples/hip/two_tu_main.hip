// An app built from two .hip files: a kernel here, two more in two_tu_kernels.hip.
#include "common.h"

void run_histogram(const float *d_in, int n, unsigned *d_bins, float *d_out, int nbins);

__global__ void square(float *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = v[i] * v[i] * 2.0f - 1.0f;
}

int main() {
  const int n = 1 << 20, nbins = 64;
  static float in[n], hist[nbins];
  fill_uniform(in, n, 11);
  float *d_in = to_device(in, n), *d_out;
  unsigned *d_bins;
  CHECK(hipMalloc(&d_bins, nbins * sizeof(unsigned)));
  CHECK(hipMemset(d_bins, 0, nbins * sizeof(unsigned)));
  CHECK(hipMalloc(&d_out, nbins * sizeof(float)));
  square<<<(n + 255) / 256, 256>>>(d_in, n);
  CHECK_LAUNCH();
  run_histogram(d_in, n, d_bins, d_out, nbins);
  to_host(hist, d_out, nbins);
  print_checksum("histogram", hist, sizeof(hist));
  CHECK(hipFree(d_in)); CHECK(hipFree(d_out)); CHECK(hipFree(d_bins));
  return 0;
}
