// ADAM-like optimizer: every launch advances all parameters by `time_steps` Adam steps with
// the gradient of the current batch. The hyper-parameters, the step count and the vector
// length are kernel scalars; the bias corrections 1 - beta^t are computed in the kernel.
//   adam [--scale F] [--n ELEMENTS] [--steps T] [--repeat R]
#include "common.h"

enum AdamMode { EPS_INSIDE_SQRT = 0, EPS_OUTSIDE_SQRT = 1 };

__global__ void adam_update(float *__restrict__ p, float *__restrict__ m, float *__restrict__ v,
                            const float *__restrict__ g, float beta1, float beta2, float eps,
                            float grad_scale, float lr, int time_steps, size_t n, int mode,
                            float weight_decay) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
    float pj = p[j], mj = m[j], vj = v[j];
    const float gj = g[j] / grad_scale;
    for (int t = 1; t <= time_steps; ++t) {
      const float grad = gj + weight_decay * pj;
      mj = beta1 * mj + (1.0f - beta1) * grad;
      vj = beta2 * vj + (1.0f - beta2) * grad * grad;
      const float m_hat = mj / (1.0f - powf(beta1, (float)t));
      const float v_hat = vj / (1.0f - powf(beta2, (float)t));
      const float denom = mode == EPS_INSIDE_SQRT ? sqrtf(v_hat + eps) : sqrtf(v_hat) + eps;
      pj -= lr * (m_hat / denom);
    }
    p[j] = pj;
    m[j] = mj;
    v[j] = vj;
  }
}

// The same arithmetic on the CPU, for one element.
static void adam_reference(float &pj, float &mj, float &vj, float g, float beta1, float beta2, float eps,
                           float grad_scale, float lr, int steps, int mode, float wd) {
  const float gj = g / grad_scale;
  for (int t = 1; t <= steps; ++t) {
    const float grad = gj + wd * pj;
    mj = beta1 * mj + (1.0f - beta1) * grad;
    vj = beta2 * vj + (1.0f - beta2) * grad * grad;
    const float m_hat = mj / (1.0f - powf(beta1, (float)t));
    const float v_hat = vj / (1.0f - powf(beta2, (float)t));
    const float denom = mode == EPS_INSIDE_SQRT ? sqrtf(v_hat + eps) : sqrtf(v_hat) + eps;
    pj -= lr * (m_hat / denom);
  }
}

int main(int argc, char **argv) {
  Options opt(argc, argv);
  const size_t n = (size_t)opt.get("n", 1 << 22);
  const int steps = (int)opt.get("steps", 10);
  const long repeat = opt.reps(opt.get("repeat", 8000));
  const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, grad_scale = 256.0f, lr = 1e-3f, wd = 0.0f;
  const int mode = EPS_OUTSIDE_SQRT;

  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
  HostRng rng(7);
  for (size_t i = 0; i < n; ++i) {
    p[i] = (float)rng.uniform(-1, 1);
    g[i] = (float)rng.uniform(-64, 64);
  }
  float *dp = to_device(p), *dm = to_device(m), *dv = to_device(v), *dg = to_device(g);
  const int block = 256;
  const int grid = (int)((n + block - 1) / block < 4096 ? (n + block - 1) / block : 4096);  // grid-stride loop
  KernelTimer timer;

  // First launch, then a CPU check of sampled elements.
  TIMED(timer, "adam_update", adam_update<<<grid, block>>>(dp, dm, dv, dg, beta1, beta2, eps, grad_scale, lr, steps, n, mode, wd));
  std::vector<float> gp(n), gm(n), gv(n);
  to_host(gp.data(), dp, n);
  to_host(gm.data(), dm, n);
  to_host(gv.data(), dv, n);
  int bad = 0, checked = 0;
  double worst = 0;
  for (size_t i = 0; i < n; i += 997, ++checked) {
    float pj = p[i], mj = m[i], vj = v[i];
    adam_reference(pj, mj, vj, g[i], beta1, beta2, eps, grad_scale, lr, steps, mode, wd);
    worst = std::fmax(worst, std::fabs(gp[i] - pj));
    if (!close_enough(gp[i], pj, 1e-4, 1e-5) || !close_enough(gm[i], mj, 1e-4, 1e-6) || !close_enough(gv[i], vj, 1e-4, 1e-8)) ++bad;
  }
  char detail[128];
  snprintf(detail, sizeof detail, "%d/%d sampled elements off, max |dp| %.3g", bad, checked, worst);
  if (report_verification("adam", bad == 0, detail)) return 1;

  for (long r = 1; r < repeat; ++r)
    TIMED(timer, "adam_update", adam_update<<<grid, block>>>(dp, dm, dv, dg, beta1, beta2, eps, grad_scale, lr, steps, n, mode, wd));
  CHECK(cudaDeviceSynchronize());
  timer.print();
  to_host(gp.data(), dp, n);
  to_host(gm.data(), dm, n);
  to_host(gv.data(), dv, n);
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(gp[i])) return report_verification("adam_final", false, "non-finite parameter");
  print_checksum("adam_p", gp.data(), n * sizeof(float));
  print_checksum("adam_m", gm.data(), n * sizeof(float));
  print_checksum("adam_v", gv.data(), n * sizeof(float));
  printf("repeat %ld\n", repeat);
  CHECK(cudaFree(dp)); CHECK(cudaFree(dm)); CHECK(cudaFree(dv)); CHECK(cudaFree(dg));
  return 0;
}
