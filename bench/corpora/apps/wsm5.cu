// WSM5-like single-moment microphysics: one thread per column, nz levels per column, the
// level count a run-time scalar. Each step: saturation adjustment (condensation and
// evaporation of cloud water), autoconversion and accretion to rain, rain terminal velocity
// and an upwind sedimentation sweep from the top level down, and the latent heating.
// Column profiles live in per-thread arrays sized for the largest level count (KMAX), as
// in Fortran-derived GPU ports. Fields are stored level-major: field[k * ncol + col].
//   wsm5 [--scale F] [--ncol N] [--nz LEVELS] [--steps S]
#include "common.h"

#define KMAX 64

struct Constants {  // physical constants of the scheme (passed as separate scalars)
  float dt, g, cpd, xlv, rd, qmin, qc0, c_acc, vt_coef, vt_exp, den0, t0c;
};

__device__ __host__ inline float sat_mixing_ratio(float t, float p) {
  const float es = 611.2f * expf(17.67f * (t - 273.15f) / (t - 29.65f));  // Bolton, Pa
  return 0.622f * es / fmaxf(p - es, 1.0f);
}

__global__ void wsm5_column(float *__restrict__ th, float *__restrict__ qv, float *__restrict__ qc,
                            float *__restrict__ qr, const float *__restrict__ pres, const float *__restrict__ dz,
                            float *__restrict__ rain, int ncol, int nz, float dt, float g, float cpd, float xlv,
                            float rd, float qmin, float qc0, float c_acc, float vt_coef, float vt_exp, float den0) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= ncol) return;
  float t[KMAX], den[KMAX], qrs[KMAX], vt[KMAX], flux[KMAX];
  const float xlvocp = xlv / cpd;

  // state -> temperature, density; saturation adjustment
  for (int k = 0; k < nz; ++k) {
    const int i = k * ncol + col;
    const float p = pres[i];
    const float exner = powf(p / 100000.0f, rd / cpd);
    float tk = th[i] * exner;
    den[k] = p / (rd * tk);
    float qvk = qv[i], qck = qc[i];
    const float qs = sat_mixing_ratio(tk, p);
    // condensation (positive) or evaporation of cloud water (negative), relaxed toward saturation
    float cond = (qvk - qs) / (1.0f + xlvocp * xlv * qs / (461.5f * tk * tk));
    cond = fmaxf(cond, -qck);
    qvk -= cond;
    qck += cond;
    tk += xlvocp * cond;
    // autoconversion above a threshold and accretion of cloud by rain
    const float autoc = qck > qc0 ? 0.001f * (qck - qc0) * dt : 0.0f;
    const float accr = fminf(c_acc * qck * powf(fmaxf(qr[i], 0.0f) * den[k], 0.875f) * dt, qck - autoc);
    qck = fmaxf(qck - autoc - fmaxf(accr, 0.0f), 0.0f);
    qrs[k] = fmaxf(qr[i], 0.0f) + autoc + fmaxf(accr, 0.0f);
    qv[i] = fmaxf(qvk, qmin);
    qc[i] = qck;
    t[k] = tk;
  }
  // rain terminal velocity
  for (int k = 0; k < nz; ++k) {
    const float rq = den[k] * qrs[k];
    vt[k] = rq > qmin ? vt_coef * powf(rq, vt_exp) * sqrtf(den0 / den[k]) : 0.0f;
  }
  // sedimentation: upwind fluxes from the top (k = nz - 1) down; what leaves level 0 is rain
  float incoming = 0.0f;
  for (int k = nz - 1; k >= 0; --k) {
    const float cfl = fminf(vt[k] * dt / dz[k * ncol + col], 1.0f);
    flux[k] = cfl * qrs[k];
    qrs[k] = qrs[k] - flux[k] + incoming * den[k < nz - 1 ? k + 1 : k] / den[k];
    incoming = flux[k];
  }
  rain[col] += incoming * den[0] * dz[col] / 1000.0f;
  // evaporation of rain in subsaturated air, latent cooling, back to potential temperature
  for (int k = 0; k < nz; ++k) {
    const int i = k * ncol + col;
    const float p = pres[i];
    const float qs = sat_mixing_ratio(t[k], p);
    const float sub = fmaxf(qs - qv[i], 0.0f);
    const float evap = fminf(0.02f * sub * sqrtf(qrs[k] * den[k]) * dt, qrs[k]);
    qv[i] += evap;
    qr[i] = qrs[k] - evap;
    const float tk = t[k] - xlvocp * evap;
    th[i] = tk / powf(p / 100000.0f, rd / cpd);
  }
}

// The same on the CPU for one column (the reference).
static void column_reference(std::vector<float> &th, std::vector<float> &qv, std::vector<float> &qc,
                             std::vector<float> &qr, const std::vector<float> &pres, const std::vector<float> &dz,
                             std::vector<float> &rain, int col, int ncol, int nz, const Constants &c) {
  float t[KMAX], den[KMAX], qrs[KMAX], vt[KMAX], flux[KMAX];
  const float xlvocp = c.xlv / c.cpd;
  for (int k = 0; k < nz; ++k) {
    const int i = k * ncol + col;
    const float p = pres[i];
    float tk = th[i] * powf(p / 100000.0f, c.rd / c.cpd);
    den[k] = p / (c.rd * tk);
    float qvk = qv[i], qck = qc[i];
    const float qs = sat_mixing_ratio(tk, p);
    float cond = (qvk - qs) / (1.0f + xlvocp * c.xlv * qs / (461.5f * tk * tk));
    cond = fmaxf(cond, -qck);
    qvk -= cond; qck += cond; tk += xlvocp * cond;
    const float autoc = qck > c.qc0 ? 0.001f * (qck - c.qc0) * c.dt : 0.0f;
    const float accr = fminf(c.c_acc * qck * powf(fmaxf(qr[i], 0.0f) * den[k], 0.875f) * c.dt, qck - autoc);
    qck = fmaxf(qck - autoc - fmaxf(accr, 0.0f), 0.0f);
    qrs[k] = fmaxf(qr[i], 0.0f) + autoc + fmaxf(accr, 0.0f);
    qv[i] = fmaxf(qvk, c.qmin); qc[i] = qck; t[k] = tk;
  }
  for (int k = 0; k < nz; ++k) {
    const float rq = den[k] * qrs[k];
    vt[k] = rq > c.qmin ? c.vt_coef * powf(rq, c.vt_exp) * sqrtf(c.den0 / den[k]) : 0.0f;
  }
  float incoming = 0.0f;
  for (int k = nz - 1; k >= 0; --k) {
    const float cfl = fminf(vt[k] * c.dt / dz[k * ncol + col], 1.0f);
    flux[k] = cfl * qrs[k];
    qrs[k] = qrs[k] - flux[k] + incoming * den[k < nz - 1 ? k + 1 : k] / den[k];
    incoming = flux[k];
  }
  rain[col] += incoming * den[0] * dz[col] / 1000.0f;
  for (int k = 0; k < nz; ++k) {
    const int i = k * ncol + col;
    const float p = pres[i];
    const float qs = sat_mixing_ratio(t[k], p);
    const float sub = fmaxf(qs - qv[i], 0.0f);
    const float evap = fminf(0.02f * sub * sqrtf(qrs[k] * den[k]) * c.dt, qrs[k]);
    qv[i] += evap; qr[i] = qrs[k] - evap;
    th[i] = (t[k] - xlvocp * evap) / powf(p / 100000.0f, c.rd / c.cpd);
  }
}

// qc and qr end as differences of nearly equal terms (autoconversion, accretion), so the GPU's
// and the CPU's float rounding differ by more than 1e-3 of the value; their error is checked
// against the fields' scale (about 1e-3 kg/kg) instead: 1e-7 absolute.
static const double kMixAbs = 1e-7;

int main(int argc, char **argv) {
  Options opt(argc, argv);
  const int ncol = (int)opt.get("ncol", 512 * 512);
  const int nz = (int)opt.get("nz", 28);
  const long steps = opt.reps(opt.get("steps", 6000));
  if (nz < 2 || nz > KMAX) {
    fprintf(stderr, "nz must be in [2, %d]\n", KMAX);
    return 2;
  }
  const Constants c{20.0f, 9.81f, 1004.5f, 2.5e6f, 287.04f, 1e-12f, 1e-3f, 2.2f, 30.0f, 0.25f, 1.28f, 273.15f};
  const size_t n = (size_t)ncol * nz;
  std::vector<float> th(n), qv(n), qc(n), qr(n), pres(n), dz(n), rain(ncol, 0.0f);
  HostRng rng(11);
  for (int col = 0; col < ncol; ++col) {
    const double warm = rng.uniform(-4, 4), moist = rng.uniform(0.7, 1.05);
    for (int k = 0; k < nz; ++k) {
      const size_t i = (size_t)k * ncol + col;
      const double z = 250.0 + 500.0 * k;                 // level height, m
      pres[i] = (float)(100000.0 * exp(-z / 8000.0));
      dz[i] = 500.0f;
      const double tk = 300.0 + warm - 0.0065 * z;        // lapse rate
      th[i] = (float)(tk / pow(pres[i] / 100000.0, 287.04 / 1004.5));
      qv[i] = (float)(moist * sat_mixing_ratio((float)tk, pres[i]));
      qc[i] = (float)(k > 2 && k < nz / 2 ? rng.uniform(0, 2e-3) : 0.0);
      qr[i] = (float)(k > nz / 3 ? rng.uniform(0, 1e-3) : 0.0);
    }
  }
  float *d_th = to_device(th), *d_qv = to_device(qv), *d_qc = to_device(qc), *d_qr = to_device(qr);
  float *d_pres = to_device(pres), *d_dz = to_device(dz), *d_rain = to_device(rain);
  const int block = 128, grid = (ncol + block - 1) / block;
  KernelTimer timer;
  auto step = [&] {
    TIMED(timer, "wsm5_column",
          wsm5_column<<<grid, block>>>(d_th, d_qv, d_qc, d_qr, d_pres, d_dz, d_rain, ncol, nz, c.dt, c.g, c.cpd,
                                       c.xlv, c.rd, c.qmin, c.qc0, c.c_acc, c.vt_coef, c.vt_exp, c.den0));
  };
  // one step, then a CPU check of sampled columns
  step();
  std::vector<float> gth(n), gqv(n), gqc(n), gqr(n), grain(ncol);
  to_host(gth.data(), d_th, n); to_host(gqv.data(), d_qv, n); to_host(gqc.data(), d_qc, n); to_host(gqr.data(), d_qr, n);
  to_host(grain.data(), d_rain, ncol);
  int bad = 0, checked = 0;
  for (int col = 0; col < ncol; col += 257, ++checked) {
    column_reference(th, qv, qc, qr, pres, dz, rain, col, ncol, nz, c);
    bool ok = close_enough(grain[col], rain[col], 1e-3, 1e-9);
    for (int k = 0; k < nz; ++k) {
      const size_t i = (size_t)k * ncol + col;
      ok &= close_enough(gth[i], th[i], 1e-4, 1e-3) && close_enough(gqv[i], qv[i], 1e-3, 1e-9) &&
            close_enough(gqc[i], qc[i], 1e-3, kMixAbs) && close_enough(gqr[i], qr[i], 1e-3, kMixAbs);
    }
    if (!ok && bad == 0) {  // the first value off, to tell a tolerance problem from a wrong kernel
      if (!close_enough(grain[col], rain[col], 1e-3, 1e-9)) fprintf(stderr, "wsm5: column %d rain %g, expected %g\n", col, grain[col], rain[col]);
      for (int k = 0; k < nz; ++k) {
        const size_t i = (size_t)k * ncol + col;
        const float g[4] = {gth[i], gqv[i], gqc[i], gqr[i]}, w[4] = {th[i], qv[i], qc[i], qr[i]};
        for (int v = 0; v < 4; ++v)
          if (!close_enough(g[v], w[v], v ? 1e-3 : 1e-4, v == 0 ? 1e-3 : v == 1 ? 1e-9 : kMixAbs))
            fprintf(stderr, "wsm5: column %d level %d %s %.9g, expected %.9g\n", col, k, "th\0qv\0qc\0qr" + 3 * v, g[v], w[v]);
      }
    }
    bad += !ok;
  }
  char detail[96];
  snprintf(detail, sizeof detail, "%d/%d sampled columns off", bad, checked);
  if (report_verification("wsm5", bad == 0, detail)) return 1;
  for (long s = 1; s < steps; ++s) step();
  CHECK(cudaDeviceSynchronize());
  timer.print();
  to_host(gth.data(), d_th, n); to_host(gqv.data(), d_qv, n); to_host(gqr.data(), d_qr, n);
  to_host(grain.data(), d_rain, ncol);
  double total = 0;
  for (int col = 0; col < ncol; ++col) total += grain[col];
  if (!std::isfinite(total)) return report_verification("wsm5_final", false, "non-finite rain");
  print_checksum("wsm5_th", gth.data(), n * sizeof(float));
  print_checksum("wsm5_qv", gqv.data(), n * sizeof(float));
  print_checksum("wsm5_qr", gqr.data(), n * sizeof(float));
  print_checksum("wsm5_rain", grain.data(), ncol * sizeof(float));
  printf("steps %ld mean_rain_mm %.6g\n", steps, total / ncol);
  return 0;
}
