// Several kernels in one translation unit: initialization, an element-wise step, a
// stencil and a two-level reduction (block partial sums, summed on the host in order).
#include "common.h"
#include <vector>

__global__ void init(float *a, int n, float base, float step) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = base + step * (float)(i % 1000);
}

__global__ void scale(float *a, int n, float factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] *= factor;
}

__global__ void stencil(const float *in, float *out, int n, int radius) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int d = -radius; d <= radius; ++d) {
    int j = i + d;
    j = j < 0 ? 0 : (j >= n ? n - 1 : j);
    s += in[j];
  }
  out[i] = s / (float)(2 * radius + 1);
}

__global__ void block_sums(const float *in, float *partial, int n) {
  extern __shared__ float buf[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? in[i] : 0.0f;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
}

int main() {
  const int n = 1 << 20, threads = 256, blocks = (n + threads - 1) / threads;
  float *a, *b, *partial;
  CHECK(cudaMalloc(&a, n * sizeof(float)));
  CHECK(cudaMalloc(&b, n * sizeof(float)));
  CHECK(cudaMalloc(&partial, blocks * sizeof(float)));
  init<<<blocks, threads>>>(a, n, 1.0f, 0.001f);
  CHECK_LAUNCH();
  scale<<<blocks, threads>>>(a, n, 0.5f);
  CHECK_LAUNCH();
  stencil<<<blocks, threads>>>(a, b, n, 4);
  CHECK_LAUNCH();
  block_sums<<<blocks, threads, threads * sizeof(float)>>>(b, partial, n);
  CHECK_LAUNCH();
  std::vector<float> hb(n), hp(blocks);
  to_host(hb.data(), b, n);
  to_host(hp.data(), partial, blocks);
  double total = 0.0;
  for (float p : hp) total += p;
  printf("sum %.6f\n", total);
  print_checksum("stencil", hb.data(), n * sizeof(float));
  print_checksum("block_sums", hp.data(), blocks * sizeof(float));
  CHECK(cudaFree(a)); CHECK(cudaFree(b)); CHECK(cudaFree(partial));
  return 0;
}
