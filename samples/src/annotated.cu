// Proteus-style annotations: annotate("jit", 2, 3) asks the JIT to fold only the 2nd and
// 3rd arguments (1-based), leaving `scale` as a run-time parameter.
#include "common.h"

__global__ __attribute__((annotate("jit", 2, 3))) void smooth(float *v, int n, int passes, float scale) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = v[i];
  for (int p = 0; p < passes; ++p) x = 0.5f * x + 0.25f * scale;
  v[i] = x;
}

int main() {
  const int n = 1 << 20;
  static float h[n];
  fill_uniform(h, n, 31);
  float *d = to_device(h, n);
  smooth<<<(n + 255) / 256, 256>>>(d, n, 6, 1.5f);
  CHECK_LAUNCH();
  smooth<<<(n + 255) / 256, 256>>>(d, n, 6, -0.5f);
  CHECK_LAUNCH();
  to_host(h, d, n);
  print_checksum("smooth", h, sizeof(h));
  CHECK(cudaFree(d));
  return 0;
}
