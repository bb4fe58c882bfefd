// HIP port of samples/src/loop_count.cu (the same kernels and checksums).
// Trip counts and coefficients arrive as scalar kernel arguments: the classic case for
// run-time constant folding (a known trip count lets the compiler unroll the loop).
#include "common.h"

__global__ void axpy_loop(int n, int iters, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = y[i];
  for (int k = 0; k < iters; ++k) acc = a * acc + x[i];
  y[i] = acc;
}

// Horner evaluation of a polynomial whose degree is a run-time scalar; double and bool scalars.
__global__ void poly_eval(int n, int degree, double scale, bool clamp, const double *coef,
                          const double *x, double *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double xi = x[i] * scale, r = 0.0;
  for (int d = degree; d >= 0; --d) r = r * xi + coef[d];
  if (clamp) r = r < -1.0 ? -1.0 : (r > 1.0 ? 1.0 : r);
  out[i] = r;
}

// 64-bit and unsigned scalars: an integer hash mixed `rounds` times.
__global__ void mix_rounds(unsigned long long n, unsigned rounds, long long salt,
                           unsigned long long *v) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long h = v[i] ^ (unsigned long long)salt;
  for (unsigned r = 0; r < rounds; ++r) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  v[i] = h;
}

int main() {
  const int n = 1 << 20;
  static float x[n], y[n];
  fill_uniform(x, n, 1);
  fill_uniform(y, n, 2);
  float *dx = to_device(x, n), *dy = to_device(y, n);
  for (int rep = 0; rep < 3; ++rep) {  // the same launch several times: later ones hit the cache
    axpy_loop<<<(n + 255) / 256, 256>>>(n, 8, 0.5f, dx, dy);
    CHECK_LAUNCH();
  }
  axpy_loop<<<(n + 127) / 128, 128>>>(n, 3, -0.25f, dx, dy);  // other values, other block size
  CHECK_LAUNCH();
  to_host(y, dy, n);
  print_checksum("axpy_loop", y, sizeof(y));

  const int m = 1 << 18, degree = 12;
  static double coef[degree + 1], px[m], out[m];
  fill_uniform(coef, degree + 1, 3);
  fill_uniform(px, m, 4);
  double *dcoef = to_device(coef, degree + 1), *dpx = to_device(px, m), *dout = to_device(out, m);
  poly_eval<<<(m + 255) / 256, 256>>>(m, degree, 0.75, true, dcoef, dpx, dout);
  CHECK_LAUNCH();
  to_host(out, dout, m);
  print_checksum("poly_eval", out, sizeof(out));

  static unsigned long long v[m];
  for (int i = 0; i < m; ++i) v[i] = (unsigned long long)i * 0x9e3779b97f4a7c15ull;
  unsigned long long *dv = to_device(v, m);
  mix_rounds<<<(m + 511) / 512, 512>>>(m, 5u, -42ll, dv);
  CHECK_LAUNCH();
  to_host(v, dv, m);
  print_checksum("mix_rounds", v, sizeof(v));

  CHECK(hipFree(dx)); CHECK(hipFree(dy)); CHECK(hipFree(dcoef)); CHECK(hipFree(dpx));
  CHECK(hipFree(dout)); CHECK(hipFree(dv));
  return 0;
}
