// Second translation unit of the two_tu app: its own fat binary, its own bitcode.
#include "common.h"

__global__ void histogram(const float *in, int n, unsigned *bins, int nbins) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int b = (int)((in[i] + 1.0f) * 0.5f * (float)nbins);
  b = b < 0 ? 0 : (b >= nbins ? nbins - 1 : b);
  atomicAdd(&bins[b], 1u);  // integer atomics: the result does not depend on the order
}

__global__ void normalize(const unsigned *bins, float *out, int nbins, float total) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nbins) out[i] = (float)bins[i] / total;
}

void run_histogram(const float *d_in, int n, unsigned *d_bins, float *d_out, int nbins) {
  histogram<<<(n + 255) / 256, 256>>>(d_in, n, d_bins, nbins);
  CHECK_LAUNCH();
  normalize<<<(nbins + 63) / 64, 64>>>(d_bins, d_out, nbins, (float)n);
  CHECK_LAUNCH();
}
