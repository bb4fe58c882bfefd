// Feynman-Kac-like Monte Carlo solution of an elliptic PDE inside an ellipsoid with
// semi-axes a, b, c: from every interior lattice point, n_walks random walks of step h
// integrate the potential along their path until they leave the domain; the estimate is
// the mean of exp(-integral) times the boundary value. Walk states (RNG) live in device
// memory, so every sweep is the same launch and accumulates into the running sums.
//   feynman_kac [--scale F] [--n LATTICE] [--walks W] [--sweeps S]
#include "common.h"

__host__ __device__ inline double potential(double a, double b, double c, double x, double y, double z) {
  return 2.0 * (pow(x / a / a, 2.0) + pow(y / b / b, 2.0) + pow(z / c / c, 2.0)) + 1.0 / a / a + 1.0 / b / b +
         1.0 / c / c;
}

__host__ __device__ inline double boundary_value(double a, double b, double c, double x, double y, double z) {
  return exp((x / a) * (x / a) + (y / b) * (y / b) + (z / c) * (z / c) - 1.0);  // the exact solution's trace
}

__host__ __device__ inline uint32_t xorshift(uint32_t &s) {
  s ^= s << 13;
  s ^= s >> 17;
  s ^= s << 5;
  return s;
}

// One lattice point, n_walks walks; returns the sum of the walks' scores.
__host__ __device__ inline double walk_point(double x0, double y0, double z0, double a, double b, double c, double h,
                                             int n_walks, int max_steps, uint32_t &rng) {
  const double step = sqrt(3.0 * h);  // times 1/sqrt(3) below: +-sqrt(h) per coordinate, variance h per step
  double total = 0.0;
  for (int w = 0; w < n_walks; ++w) {
    double x = x0, y = y0, z = z0, weight = 0.0;
    for (int s = 0; s < max_steps; ++s) {
      const double v = potential(a, b, c, x, y, z);
      const uint32_t r = xorshift(rng);
      const double dx = (r & 1) ? step : -step, dy = (r & 2) ? step : -step, dz = (r & 4) ? step : -step;
      const double x1 = x + dx * 0.5773502691896258, y1 = y + dy * 0.5773502691896258, z1 = z + dz * 0.5773502691896258;
      weight += 0.5 * h * (v + potential(a, b, c, x1, y1, z1));
      x = x1; y = y1; z = z1;
      if ((x / a) * (x / a) + (y / b) * (y / b) + (z / c) * (z / c) >= 1.0) break;
    }
    total += exp(-weight) * boundary_value(a, b, c, x, y, z);
  }
  return total;
}

__global__ void feynman_kac(double *__restrict__ sums, uint32_t *__restrict__ rng_state, double a, double b, double c,
                            double h, int n_walks, int max_steps, int nx, int ny, int nz) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nx * ny * nz) return;
  const int ix = i % nx, iy = (i / nx) % ny, iz = i / (nx * ny);
  const double x = -a + 2.0 * a * (ix + 0.5) / nx, y = -b + 2.0 * b * (iy + 0.5) / ny, z = -c + 2.0 * c * (iz + 0.5) / nz;
  if ((x / a) * (x / a) + (y / b) * (y / b) + (z / c) * (z / c) >= 1.0) return;  // outside the ellipsoid
  uint32_t s = rng_state[i];
  sums[i] += walk_point(x, y, z, a, b, c, h, n_walks, max_steps, s);
  rng_state[i] = s;
}

int main(int argc, char **argv) {
  Options opt(argc, argv);
  const int n = (int)opt.get("n", 48), n_walks = (int)opt.get("walks", 16);
  const long sweeps = opt.reps(opt.get("sweeps", 150));
  const double a = 3.0, b = 2.0, c = 1.5, h = 0.001;
  const int max_steps = 100000;
  const int nx = n, ny = n, nz = n, points = nx * ny * nz;
  std::vector<uint32_t> rng(points);
  HostRng host(5);
  for (auto &r : rng) r = (uint32_t)(host.next() | 1);
  std::vector<double> sums(points, 0.0);
  double *d_sums = to_device(sums);
  uint32_t *d_rng = to_device(rng);
  const int block = 128, grid = (points + block - 1) / block;
  KernelTimer timer;
  for (long s = 0; s < sweeps; ++s)
    TIMED(timer, "feynman_kac", feynman_kac<<<grid, block>>>(d_sums, d_rng, a, b, c, h, n_walks, max_steps, nx, ny, nz));
  CHECK(cudaDeviceSynchronize());
  timer.print();
  to_host(sums.data(), d_sums, points);
  // CPU reference: replay every sweep of a few sampled points from the same RNG states
  int bad = 0, checked = 0;
  for (int i = points / 2 + nx * ny / 2; i < points && checked < 6; i += 7919) {
    const int ix = i % nx, iy = (i / nx) % ny, iz = i / (nx * ny);
    const double x = -a + 2.0 * a * (ix + 0.5) / nx, y = -b + 2.0 * b * (iy + 0.5) / ny, z = -c + 2.0 * c * (iz + 0.5) / nz;
    if ((x / a) * (x / a) + (y / b) * (y / b) + (z / c) * (z / c) >= 1.0) continue;
    uint32_t s = rng[i];
    double want = 0;
    for (long k = 0; k < sweeps; ++k) want += walk_point(x, y, z, a, b, c, h, n_walks, max_steps, s);
    bad += !close_enough(sums[i], want, 1e-6, 1e-9);
    ++checked;
  }
  // and the estimate against the exact solution exp(x^2/a^2 + y^2/b^2 + z^2/c^2 - 1) (statistical)
  double err_exact = 0;
  int inside = 0;
  for (int i = 0; i < points; ++i) {
    const int ix = i % nx, iy = (i / nx) % ny, iz = i / (nx * ny);
    const double x = -a + 2.0 * a * (ix + 0.5) / nx, y = -b + 2.0 * b * (iy + 0.5) / ny, z = -c + 2.0 * c * (iz + 0.5) / nz;
    const double r2 = (x / a) * (x / a) + (y / b) * (y / b) + (z / c) * (z / c);
    if (r2 >= 1.0) continue;
    ++inside;
    const double est = sums[i] / (n_walks * (double)sweeps), exact = exp(r2 - 1.0);
    err_exact += fabs(est - exact) / exact;
  }
  err_exact /= inside > 0 ? inside : 1;
  char detail[160];
  snprintf(detail, sizeof detail, "%d/%d replayed points off; mean relative error vs exact solution %.4f over %d points",
           bad, checked, err_exact, inside);
  if (report_verification("feynman_kac", bad == 0 && std::isfinite(err_exact) && err_exact < 0.15, detail)) return 1;
  print_checksum("feynman_kac_sums", sums.data(), points * sizeof(double));
  printf("sweeps %ld\n", sweeps);
  return 0;
}
