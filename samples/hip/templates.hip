// HIP port of samples/src/templates.cu.
// Mangled names and unusual parameters: a templated kernel instantiated three times, a
// kernel taking a struct by value, and a kernel with __launch_bounds__.
#include "common.h"

template <typename T, int UNROLL>
__global__ void scale_add(T *out, const T *in, T alpha, int n) {
  int base = (blockIdx.x * blockDim.x + threadIdx.x) * UNROLL;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    int i = base + u;
    if (i < n) out[i] = alpha * in[i] + out[i];
  }
}

struct Affine {
  float scale;
  float shift;
  int n;
  int stride;
  double bias;
};

__global__ void affine(Affine p, const float *in, float *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  out[i] = p.scale * in[(i * p.stride) % p.n] + p.shift + (float)p.bias;
}

__global__ void __launch_bounds__(128, 4) bounded_sum(const float *in, float *out, int n, int width) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int k = 0; k < width; ++k) s += in[(i + k) % n];
  out[i] = s;
}

int main() {
  const int n = 1 << 20;
  static float fin[n], fout[n];
  static double din_h[n], dout_h[n];
  static int iin[n], iout[n];
  fill_uniform(fin, n, 21);
  fill_uniform(din_h, n, 22);
  for (int i = 0; i < n; ++i) iin[i] = i % 977 - 488;
  float *fi = to_device(fin, n), *fo;
  double *di = to_device(din_h, n), *dd;
  int *ii = to_device(iin, n), *io;
  CHECK(hipMalloc(&fo, n * sizeof(float)));   CHECK(hipMemset(fo, 0, n * sizeof(float)));
  CHECK(hipMalloc(&dd, n * sizeof(double)));  CHECK(hipMemset(dd, 0, n * sizeof(double)));
  CHECK(hipMalloc(&io, n * sizeof(int)));     CHECK(hipMemset(io, 0, n * sizeof(int)));

  scale_add<float, 4><<<(n / 4 + 255) / 256, 256>>>(fo, fi, 1.5f, n);
  CHECK_LAUNCH();
  scale_add<double, 2><<<(n / 2 + 255) / 256, 256>>>(dd, di, -0.75, n);
  CHECK_LAUNCH();
  scale_add<int, 1><<<(n + 255) / 256, 256>>>(io, ii, 3, n);
  CHECK_LAUNCH();
  to_host(fout, fo, n); to_host(dout_h, dd, n); to_host(iout, io, n);
  print_checksum("scale_add_f4", fout, sizeof(fout));
  print_checksum("scale_add_d2", dout_h, sizeof(dout_h));
  print_checksum("scale_add_i1", iout, sizeof(iout));

  Affine p{2.0f, -0.5f, n, 3, 0.125};
  affine<<<(n + 255) / 256, 256>>>(p, fi, fo);
  CHECK_LAUNCH();
  to_host(fout, fo, n);
  print_checksum("affine", fout, sizeof(fout));

  bounded_sum<<<(n + 127) / 128, 128>>>(fi, fo, n, 16);
  CHECK_LAUNCH();
  to_host(fout, fo, n);
  print_checksum("bounded_sum", fout, sizeof(fout));

  CHECK(hipFree(fi)); CHECK(hipFree(fo)); CHECK(hipFree(di)); CHECK(hipFree(dd));
  CHECK(hipFree(ii)); CHECK(hipFree(io));
  return 0;
}
