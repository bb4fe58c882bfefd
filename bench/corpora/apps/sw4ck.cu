// SW4CK-like 4th-order finite differences for the (scalar) wave equation with variable
// material coefficients: three flux kernels (one per direction), an update kernel and a
// boundary kernel per time step, all on an ni x nj x nk grid with two ghost layers. The
// grid extents, spacing, time step and ghost width are kernel scalars.
//   sw4ck [--scale F] [--n CELLS_PER_SIDE] [--steps S]
#include "common.h"

#define IDX(i, j, k) ((size_t)(k) * nj * ni + (size_t)(j) * ni + (i))

__host__ __device__ inline double d4(const double *f, size_t c, size_t s, double inv12h) {  // 4th-order first derivative
  return (f[c - 2 * s] - 8.0 * f[c - s] + 8.0 * f[c + s] - f[c + 2 * s]) * inv12h;
}

__host__ __device__ inline void flux_point(double *fl, const double *u, const double *mu, int i, int j, int k, int ni,
                                           int nj, size_t stride, double h) {
  const size_t c = IDX(i, j, k);
  fl[c] = mu[c] * d4(u, c, stride, 1.0 / (12.0 * h));
}

__global__ void flux_x(double *fl, const double *u, const double *mu, int ni, int nj, int nk, int ng, double h) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x + ng, j = blockIdx.y + ng, k = blockIdx.z + ng;
  if (i < ni - ng) flux_point(fl, u, mu, i, j, k, ni, nj, 1, h);
}
__global__ void flux_y(double *fl, const double *u, const double *mu, int ni, int nj, int nk, int ng, double h) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x + ng, j = blockIdx.y + ng, k = blockIdx.z + ng;
  if (i < ni - ng) flux_point(fl, u, mu, i, j, k, ni, nj, (size_t)ni, h);
}
__global__ void flux_z(double *fl, const double *u, const double *mu, int ni, int nj, int nk, int ng, double h) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x + ng, j = blockIdx.y + ng, k = blockIdx.z + ng;
  if (i < ni - ng) flux_point(fl, u, mu, i, j, k, ni, nj, (size_t)ni * nj, h);
}

__host__ __device__ inline void update_point(double *un, const double *u, const double *um, const double *fx,
                                             const double *fy, const double *fz, const double *rho, int i, int j, int k,
                                             int ni, int nj, double h, double dt) {
  const size_t c = IDX(i, j, k);
  const double inv12h = 1.0 / (12.0 * h);
  const double div = d4(fx, c, 1, inv12h) + d4(fy, c, (size_t)ni, inv12h) + d4(fz, c, (size_t)ni * nj, inv12h);
  un[c] = 2.0 * u[c] - um[c] + dt * dt / rho[c] * div;
}

__global__ void update(double *un, const double *u, const double *um, const double *fx, const double *fy, const double *fz,
                       const double *rho, int ni, int nj, int nk, int ng, double h, double dt) {
  // fluxes are valid from ng on; the divergence needs two more on each side
  const int i = blockIdx.x * blockDim.x + threadIdx.x + 2 * ng, j = blockIdx.y + 2 * ng, k = blockIdx.z + 2 * ng;
  if (i < ni - 2 * ng) update_point(un, u, um, fx, fy, fz, rho, i, j, k, ni, nj, h, dt);
}

// Zero (Dirichlet) values in the outer 2*ng layers of every face.
__global__ void boundary(double *un, int ni, int nj, int nk, int ng) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y, k = blockIdx.z;
  if (i >= ni) return;
  const int w = 2 * ng;
  if (i < w || i >= ni - w || j < w || j >= nj - w || k < w || k >= nk - w) un[IDX(i, j, k)] = 0.0;
}

int main(int argc, char **argv) {
  Options opt(argc, argv);
  const int n = (int)opt.get("n", 160), ng = 2;
  const long steps = opt.reps(opt.get("steps", 6000));
  const int ni = n, nj = n, nk = n;
  const size_t total = (size_t)ni * nj * nk;
  const double h = 1.0 / (n - 1), dt = 0.25 * h;  // stable for the wave speeds below
  std::vector<double> u(total), um(total), mu(total), rho(total), zero(total, 0.0);
  HostRng rng(9);
  for (int k = 0; k < nk; ++k)
    for (int j = 0; j < nj; ++j)
      for (int i = 0; i < ni; ++i) {
        const size_t c = IDX(i, j, k);
        const double x = i * h - 0.5, y = j * h - 0.5, z = k * h - 0.5;
        u[c] = exp(-200.0 * (x * x + y * y + z * z));  // a Gaussian pulse at rest
        um[c] = u[c];
        mu[c] = 1.0 + 0.5 * rng.uniform();
        rho[c] = 1.0 + 0.5 * rng.uniform();
      }
  double *d_u = to_device(u), *d_um = to_device(um), *d_un = to_device(zero), *d_mu = to_device(mu), *d_rho = to_device(rho);
  double *d_fx = to_device(zero), *d_fy = to_device(zero), *d_fz = to_device(zero);
  const int block = 128;
  const dim3 gflux((ni - 2 * ng + block - 1) / block, nj - 2 * ng, nk - 2 * ng);
  const dim3 gupd((ni - 4 * ng + block - 1) / block, nj - 4 * ng, nk - 4 * ng);
  const dim3 gall((ni + block - 1) / block, nj, nk);
  KernelTimer timer;
  auto step = [&] {
    TIMED(timer, "flux_x", flux_x<<<gflux, block>>>(d_fx, d_u, d_mu, ni, nj, nk, ng, h));
    TIMED(timer, "flux_y", flux_y<<<gflux, block>>>(d_fy, d_u, d_mu, ni, nj, nk, ng, h));
    TIMED(timer, "flux_z", flux_z<<<gflux, block>>>(d_fz, d_u, d_mu, ni, nj, nk, ng, h));
    TIMED(timer, "update", update<<<gupd, block>>>(d_un, d_u, d_um, d_fx, d_fy, d_fz, d_rho, ni, nj, nk, ng, h, dt));
    TIMED(timer, "boundary", boundary<<<gall, block>>>(d_un, ni, nj, nk, ng));
    double *t = d_um; d_um = d_u; d_u = d_un; d_un = t;  // rotate time levels
  };
  // one step, then the CPU computes the same step at sampled interior points
  step();
  std::vector<double> got(total), fx(total, 0.0), fy(total, 0.0), fz(total, 0.0);
  to_host(got.data(), d_u, total);
  int bad = 0, checked = 0;
  HostRng pick(13);
  for (int s = 0; s < 2000; ++s) {
    const int i = 2 * ng + (int)(pick.uniform() * (ni - 4 * ng)), j = 2 * ng + (int)(pick.uniform() * (nj - 4 * ng)),
              k = 2 * ng + (int)(pick.uniform() * (nk - 4 * ng));
    for (int o = -2; o <= 2; ++o) {  // the fluxes the divergence reads
      flux_point(fx.data(), u.data(), mu.data(), i + o, j, k, ni, nj, 1, h);
      flux_point(fy.data(), u.data(), mu.data(), i, j + o, k, ni, nj, (size_t)ni, h);
      flux_point(fz.data(), u.data(), mu.data(), i, j, k + o, ni, nj, (size_t)ni * nj, h);
    }
    std::vector<double> &want = zero;
    update_point(want.data(), u.data(), um.data(), fx.data(), fy.data(), fz.data(), rho.data(), i, j, k, ni, nj, h, dt);
    const size_t c = IDX(i, j, k);
    bad += !close_enough(got[c], want[c], 1e-9, 1e-12);
    ++checked;
  }
  char detail[96];
  snprintf(detail, sizeof detail, "%d/%d sampled points off", bad, checked);
  if (report_verification("sw4ck", bad == 0, detail)) return 1;
  for (long s = 1; s < steps; ++s) step();
  CHECK(cudaDeviceSynchronize());
  timer.print();
  to_host(got.data(), d_u, total);
  double energy = 0;
  for (size_t c = 0; c < total; ++c) energy += got[c] * got[c];
  if (!std::isfinite(energy)) return report_verification("sw4ck_final", false, "non-finite field");
  print_checksum("sw4ck_u", got.data(), total * sizeof(double));
  printf("steps %ld sum_u2 %.9e\n", steps, energy);
  return 0;
}
