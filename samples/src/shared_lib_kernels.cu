// The shared library of the shared_lib apps: every kernel, and the host code that launches them.
#include "common.h"

__global__ void polynomial(const float *x, float *y, int n, int degree, float scale) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.0f, p = 1.0f;
  for (int d = 0; d < degree; ++d) {  // a trip count the JIT folds
    acc += p * scale / (float)(d + 1);
    p *= x[i];
  }
  y[i] = acc;
}

__global__ void smooth(const float *y, float *z, int n, int radius) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int k = -radius; k <= radius; ++k) {
    int j = i + k;
    s += y[j < 0 ? 0 : (j >= n ? n - 1 : j)];
  }
  z[i] = s / (float)(2 * radius + 1);
}

int run_kernels(void) {
  const int n = 1 << 18;
  static float x[n], z[n];
  fill_uniform(x, n, 5);
  float *d_x = to_device(x, n), *d_y, *d_z;
  CHECK(cudaMalloc(&d_y, n * sizeof(float)));
  CHECK(cudaMalloc(&d_z, n * sizeof(float)));
  for (int round = 0; round < 4; ++round) {
    polynomial<<<(n + 255) / 256, 256>>>(d_x, d_y, n, 12, 0.5f);
    CHECK_LAUNCH();
    smooth<<<(n + 127) / 128, 128>>>(d_y, d_z, n, 3);
    CHECK_LAUNCH();
  }
  to_host(z, d_z, n);
  print_checksum("smooth", z, sizeof(z));
  CHECK(cudaFree(d_x)); CHECK(cudaFree(d_y)); CHECK(cudaFree(d_z));
  return 0;
}
