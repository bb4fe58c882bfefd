// LULESH-like Lagrangian hydrodynamics (a Sedov blast on a hex mesh of nx^3 elements, a
// symmetry plane on each of the three low faces, rigid walls on the three high ones): per time step eight kernels over elements
// and nodes -- corner forces, nodal gather, nodal update, kinematics, artificial viscosity,
// equation of state, the Courant reduction and the time-step control. The time step lives
// in device memory (no host round trip per step); the mesh extents, the material and
// viscosity constants are kernel scalars.
//   lulesh [--scale F] [--nx ELEMENTS_PER_SIDE] [--steps S]
#include "common.h"

struct Params {  // the constants of the problem (passed to kernels as separate scalars)
  double gamma, qlc, qqc, q_cut, e_cut, p_cut, u_cut, emin, pmin, courant, dt_growth, dt_max, hg;
};

__host__ __device__ inline int node_index(int i, int j, int k, int nn) { return (k * nn + j) * nn + i; }

// Corner forces of element e: the pressure force, work-conjugate to the element volume below
// (F = (p + q) dV/dx_corner), plus an hourglass restoring force (coefficient hg) that pulls
// each corner toward where a parallelepiped with the element's extents would put it.
__host__ __device__ inline void corner_forces(int e, int nx, const double *x, const double *y, const double *z,
                                              const double *p, const double *q, const double *rho0v, const double *vol,
                                              const double *ss, double *fc, double hg) {
  const int nn = nx + 1, i = e % nx, j = (e / nx) % nx, k = e / (nx * nx);
  const double *pos[3] = {x, y, z};
  double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
  int node[8];
  for (int c = 0; c < 8; ++c) {
    node[c] = node_index(i + (c & 1), j + ((c >> 1) & 1), k + (c >> 2), nn);
    for (int d = 0; d < 3; ++d) ((c >> d) & 1 ? hi : lo)[d] += pos[d][node[c]];
  }
  double ext[3], mid[3];
  for (int d = 0; d < 3; ++d) {
    ext[d] = 0.25 * (hi[d] - lo[d]);
    mid[d] = 0.125 * (hi[d] + lo[d]);
  }
  const double sig = p[e] + q[e];
  const double len = cbrt(vol[e]), stiff = hg * (rho0v[e] / vol[e]) * ss[e] * ss[e] * len;
  for (int c = 0; c < 8; ++c)
    for (int d = 0; d < 3; ++d) {
      const double side = (c >> d) & 1 ? 1.0 : -1.0;
      const double area = 0.25 * ext[(d + 1) % 3] * ext[(d + 2) % 3];  // dV/dx of this corner, in magnitude
      const double off = pos[d][node[c]] - (mid[d] + 0.5 * side * ext[d]);
      fc[e * 24 + c * 3 + d] = side * sig * area - stiff * off;
    }
}

__host__ __device__ inline void gather_force(int n, int nx, const double *fc, double *f) {
  const int nn = nx + 1, i = n % nn, j = (n / nn) % nn, k = n / (nn * nn);
  double s[3] = {0, 0, 0};
  for (int c = 0; c < 8; ++c) {  // the element whose corner c is this node
    const int ei = i - (c & 1), ej = j - ((c >> 1) & 1), ek = k - (c >> 2);
    if (ei < 0 || ej < 0 || ek < 0 || ei >= nx || ej >= nx || ek >= nx) continue;
    const int e = (ek * nx + ej) * nx + ei;
    for (int d = 0; d < 3; ++d) s[d] += fc[e * 24 + c * 3 + d];
  }
  for (int d = 0; d < 3; ++d) f[n * 3 + d] = s[d];
}

__host__ __device__ inline void update_node(int n, int nx, const double *f, const double *mass, double *v, double *x,
                                            double *y, double *z, double dt, double u_cut) {
  const int nn = nx + 1, i = n % nn, j = (n / nn) % nn, k = n / (nn * nn);
  double *pos[3] = {x, y, z};
  const int on_plane[3] = {i == 0 || i == nn - 1, j == 0 || j == nn - 1, k == 0 || k == nn - 1};
  for (int d = 0; d < 3; ++d) {
    double vd = v[n * 3 + d] + f[n * 3 + d] / mass[n] * dt;
    if (fabs(vd) < u_cut || on_plane[d]) vd = 0.0;  // symmetry planes and walls: no normal velocity
    v[n * 3 + d] = vd;
    pos[d][n] += vd * dt;
  }
}

__host__ __device__ inline double element_volume(int e, int nx, const double *x, const double *y, const double *z) {
  const int nn = nx + 1, i = e % nx, j = (e / nx) % nx, k = e / (nx * nx);
  double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
  for (int c = 0; c < 8; ++c) {
    const int n = node_index(i + (c & 1), j + ((c >> 1) & 1), k + (c >> 2), nn);
    (c & 1 ? hi : lo)[0] += x[n];
    ((c >> 1) & 1 ? hi : lo)[1] += y[n];
    (c >> 2 ? hi : lo)[2] += z[n];
  }
  return 0.015625 * (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]);  // (1/4)^3 of the face-mean extents
}

__host__ __device__ inline void kinematics(int e, int nx, const double *x, const double *y, const double *z, double *vol,
                                           double *dvol, const double *dt) {
  const double vn = element_volume(e, nx, x, y, z);
  dvol[e] = (vn - vol[e]) / (vol[e] * dt[0]);  // relative volume change rate, 1/s
  vol[e] = vn;
}

__host__ __device__ inline void viscosity(int e, const double *rho0v, const double *vol, const double *dvol,
                                          const double *ss, double *q, double qlc, double qqc, double q_cut) {
  const double rho = rho0v[e] / vol[e], len = cbrt(vol[e]), dv = dvol[e] * len;
  double qe = dv < 0.0 ? rho * (qlc * ss[e] * -dv + qqc * dv * dv) : 0.0;
  q[e] = qe < q_cut ? 0.0 : qe;
}

__host__ __device__ inline void eos(int e, const double *rho0v, const double *vol, const double *dvol, const double *q,
                                    double *p, double *en, double *ss, const double *dt, double gamma, double e_cut,
                                    double p_cut, double emin, double pmin) {
  const double mass = rho0v[e], rho = mass / vol[e];
  const double rel = dvol[e] * dt[0];                 // (V_new - V_old) / V_old
  const double dV = vol[e] * rel / (1.0 + rel);      // V_new - V_old
  double enew = en[e] - (p[e] + q[e]) * dV / mass;  // p dV work
  if (fabs(enew) < e_cut) enew = 0.0;
  enew = fmax(enew, emin);
  double pnew = (gamma - 1.0) * rho * enew;
  if (fabs(pnew) < p_cut) pnew = 0.0;
  pnew = fmax(pnew, pmin);
  en[e] = enew;
  p[e] = pnew;
  ss[e] = sqrt(fmax(gamma * pnew / rho, 1e-36));
}

__host__ __device__ inline double courant_dt(int e, const double *vol, const double *ss, const double *dvol) {
  const double len = cbrt(vol[e]);
  return len / (ss[e] + fabs(dvol[e]) * len + 1e-20);
}

__global__ void calc_corner_forces(int nx, const double *x, const double *y, const double *z, const double *p,
                                   const double *q, const double *rho0v, const double *vol, const double *ss, double *fc,
                                   double hg) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < nx * nx * nx) corner_forces(e, nx, x, y, z, p, q, rho0v, vol, ss, fc, hg);
}
__global__ void gather_nodal_forces(int nx, const double *fc, double *f) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n < (nx + 1) * (nx + 1) * (nx + 1)) gather_force(n, nx, fc, f);
}
__global__ void update_nodes(int nx, const double *f, const double *mass, double *v, double *x, double *y, double *z,
                             const double *dt, double u_cut) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n < (nx + 1) * (nx + 1) * (nx + 1)) update_node(n, nx, f, mass, v, x, y, z, dt[0], u_cut);
}
__global__ void calc_kinematics(int nx, const double *x, const double *y, const double *z, double *vol, double *dvol,
                                const double *dt) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < nx * nx * nx) kinematics(e, nx, x, y, z, vol, dvol, dt);
}
__global__ void calc_viscosity(int nelem, const double *rho0v, const double *vol, const double *dvol, const double *ss,
                               double *q, double qlc, double qqc, double q_cut) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < nelem) viscosity(e, rho0v, vol, dvol, ss, q, qlc, qqc, q_cut);
}
__global__ void calc_eos(int nelem, const double *rho0v, const double *vol, const double *dvol, const double *q, double *p,
                         double *en, double *ss, const double *dt, double gamma, double e_cut, double p_cut, double emin,
                         double pmin) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < nelem) eos(e, rho0v, vol, dvol, q, p, en, ss, dt, gamma, e_cut, p_cut, emin, pmin);
}
// Minimum Courant time step over all elements: a block reduction, then one atomicMin on the
// bits of a positive double (which order like the doubles themselves).
__global__ void calc_courant(int nelem, const double *vol, const double *ss, const double *dvol,
                             unsigned long long *dtc_bits) {
  __shared__ double m[256];
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  m[threadIdx.x] = e < nelem ? courant_dt(e, vol, ss, dvol) : 1e300;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) m[threadIdx.x] = fmin(m[threadIdx.x], m[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicMin(dtc_bits, (unsigned long long)__double_as_longlong(m[0]));
}
__global__ void time_control(double *dt, unsigned long long *dtc_bits, double *time, double courant, double growth,
                             double dt_max) {
  const double dtc = __longlong_as_double((long long)*dtc_bits);
  dt[0] = fmin(fmin(courant * dtc, growth * dt[0]), dt_max);
  time[0] += dt[0];
  *dtc_bits = 0x7FEFFFFFFFFFFFFFull;  // reset for the next step (largest finite double)
}

struct Mesh {
  int nx, nelem, nnode;
  std::vector<double> x, y, z, v, mass, rho0v, vol, dvol, p, q, en, ss, fc, f;
  double dt, time;
};

static Mesh make_mesh(int nx) {
  Mesh m;
  m.nx = nx; m.nelem = nx * nx * nx; m.nnode = (nx + 1) * (nx + 1) * (nx + 1);
  const int nn = nx + 1;
  const double h = 1.125 / nx;
  m.x.resize(m.nnode); m.y.resize(m.nnode); m.z.resize(m.nnode); m.v.assign(3 * m.nnode, 0.0);
  m.mass.assign(m.nnode, 0.0);
  for (int k = 0; k < nn; ++k)
    for (int j = 0; j < nn; ++j)
      for (int i = 0; i < nn; ++i) {
        const int n = node_index(i, j, k, nn);
        m.x[n] = i * h; m.y[n] = j * h; m.z[n] = k * h;
      }
  m.rho0v.assign(m.nelem, h * h * h);  // density 1
  m.vol.assign(m.nelem, h * h * h);
  m.dvol.assign(m.nelem, 0.0); m.p.assign(m.nelem, 0.0); m.q.assign(m.nelem, 0.0);
  m.en.assign(m.nelem, 1.0); m.ss.assign(m.nelem, 0.0);  // a gas at rest (specific energy 1), then the blast
  m.fc.assign((size_t)24 * m.nelem, 0.0); m.f.assign(3 * m.nnode, 0.0);
  for (int e = 0; e < m.nelem; ++e) {  // nodal mass: an eighth of each adjacent element's
    const int i = e % nx, j = (e / nx) % nx, k = e / (nx * nx);
    for (int c = 0; c < 8; ++c) m.mass[node_index(i + (c & 1), j + ((c >> 1) & 1), k + (c >> 2), nn)] += m.rho0v[e] / 8;
  }
  m.en[0] = 64.0;  // the blast: the corner element starts 64 times as hot
  for (int e = 0; e < m.nelem; ++e) m.p[e] = (1.4 - 1.0) * (m.rho0v[e] / m.vol[e]) * m.en[e];
  for (int e = 0; e < m.nelem; ++e) m.ss[e] = sqrt(fmax(1.4 * m.p[e] / (m.rho0v[e] / m.vol[e]), 1e-36));
  m.dt = 1e-7;
  m.time = 0;
  return m;
}

// One step on the CPU: the reference.
static void cpu_step(Mesh &m, const Params &c) {
  for (int e = 0; e < m.nelem; ++e)
    corner_forces(e, m.nx, m.x.data(), m.y.data(), m.z.data(), m.p.data(), m.q.data(), m.rho0v.data(), m.vol.data(),
                  m.ss.data(), m.fc.data(), c.hg);
  for (int n = 0; n < m.nnode; ++n) gather_force(n, m.nx, m.fc.data(), m.f.data());
  for (int n = 0; n < m.nnode; ++n)
    update_node(n, m.nx, m.f.data(), m.mass.data(), m.v.data(), m.x.data(), m.y.data(), m.z.data(), m.dt, c.u_cut);
  for (int e = 0; e < m.nelem; ++e) kinematics(e, m.nx, m.x.data(), m.y.data(), m.z.data(), m.vol.data(), m.dvol.data(), &m.dt);
  for (int e = 0; e < m.nelem; ++e)
    viscosity(e, m.rho0v.data(), m.vol.data(), m.dvol.data(), m.ss.data(), m.q.data(), c.qlc, c.qqc, c.q_cut);
  for (int e = 0; e < m.nelem; ++e)
    eos(e, m.rho0v.data(), m.vol.data(), m.dvol.data(), m.q.data(), m.p.data(), m.en.data(), m.ss.data(), &m.dt, c.gamma,
        c.e_cut, c.p_cut, c.emin, c.pmin);
  double dtc = 1.79769313486231570e308;
  for (int e = 0; e < m.nelem; ++e) dtc = fmin(dtc, courant_dt(e, m.vol.data(), m.ss.data(), m.dvol.data()));
  m.dt = fmin(fmin(c.courant * dtc, c.dt_growth * m.dt), c.dt_max);
  m.time += m.dt;
}

int main(int argc, char **argv) {
  Options opt(argc, argv);
  const int nx = (int)opt.get("nx", 64);
  const long steps = opt.reps(opt.get("steps", 12000));
  const Params c{1.4, 0.5, 2.0 / 3.0, 1e-7, 1e-7, 1e-7, 1e-7, 0.0, 0.0, 0.3, 1.2, 1e-2, 0.1};
  Mesh m = make_mesh(nx);
  const int nelem = m.nelem, nnode = m.nnode;
  double *x = to_device(m.x), *y = to_device(m.y), *z = to_device(m.z), *v = to_device(m.v), *mass = to_device(m.mass);
  double *rho0v = to_device(m.rho0v), *vol = to_device(m.vol), *dvol = to_device(m.dvol), *p = to_device(m.p);
  double *q = to_device(m.q), *en = to_device(m.en), *ss = to_device(m.ss), *fc = to_device(m.fc), *f = to_device(m.f);
  double *dt = to_device(&m.dt, 1), *time = to_device(&m.time, 1);
  const unsigned long long big = 0x7FEFFFFFFFFFFFFFull;
  unsigned long long *dtc = to_device(&big, 1);
  const int block = 256, ge = (nelem + block - 1) / block, gn = (nnode + block - 1) / block;
  KernelTimer timer;
  auto step = [&] {
    TIMED(timer, "calc_corner_forces", calc_corner_forces<<<ge, block>>>(nx, x, y, z, p, q, rho0v, vol, ss, fc, c.hg));
    TIMED(timer, "gather_nodal_forces", gather_nodal_forces<<<gn, block>>>(nx, fc, f));
    TIMED(timer, "update_nodes", update_nodes<<<gn, block>>>(nx, f, mass, v, x, y, z, dt, c.u_cut));
    TIMED(timer, "calc_kinematics", calc_kinematics<<<ge, block>>>(nx, x, y, z, vol, dvol, dt));
    TIMED(timer, "calc_viscosity", calc_viscosity<<<ge, block>>>(nelem, rho0v, vol, dvol, ss, q, c.qlc, c.qqc, c.q_cut));
    TIMED(timer, "calc_eos", calc_eos<<<ge, block>>>(nelem, rho0v, vol, dvol, q, p, en, ss, dt, c.gamma, c.e_cut, c.p_cut,
                                                     c.emin, c.pmin));
    TIMED(timer, "calc_courant", calc_courant<<<ge, block>>>(nelem, vol, ss, dvol, dtc));
    TIMED(timer, "time_control", time_control<<<1, 1>>>(dt, dtc, time, c.courant, c.dt_growth, c.dt_max));
  };
  // two steps, then the same two on the CPU over the whole mesh
  const int check_steps = 2;
  for (int s = 0; s < check_steps; ++s) step();
  for (int s = 0; s < check_steps; ++s) cpu_step(m, c);
  std::vector<double> gx(nnode), gen(nelem);
  double gdt;
  to_host(gx.data(), x, nnode);
  to_host(gen.data(), en, nelem);
  to_host(&gdt, dt, 1);
  int bad = !close_enough(gdt, m.dt, 1e-9, 0);
  for (int n = 0; n < nnode; ++n) bad += !close_enough(gx[n], m.x[n], 1e-12, 1e-15);
  for (int e = 0; e < nelem; ++e) bad += !close_enough(gen[e], m.en[e], 1e-9, 1e-12);
  char detail[96];
  snprintf(detail, sizeof detail, "%d of %d values off after %d steps", bad, nnode + nelem + 1, check_steps);
  if (report_verification("lulesh", bad == 0, detail)) return 1;
  for (long s = check_steps; s < steps; ++s) step();
  CHECK(cudaDeviceSynchronize());
  timer.print();
  double t;
  to_host(&t, time, 1);
  to_host(gen.data(), en, nelem);
  to_host(gx.data(), x, nnode);
  double etot = 0;
  for (int e = 0; e < nelem; ++e) etot += gen[e] * m.rho0v[e];
  if (!std::isfinite(etot) || !std::isfinite(t)) return report_verification("lulesh_final", false, "non-finite state");
  print_checksum("lulesh_energy", gen.data(), nelem * sizeof(double));
  print_checksum("lulesh_x", gx.data(), nnode * sizeof(double));
  printf("steps %ld time %.9e internal_energy %.9e\n", steps, t, etot);
  return 0;
}
