// Legacy warp-synchronous code: lanes of a warp communicate through memory with plain loads and
// stores, no atomics, no __syncwarp, relying on the warp running in lockstep. A data race under
// the CUDA memory model, and common in real programs. Folding the scalar that drives each loop
// lets the optimizer unroll it and merge a lane's updates, which changes the result; the tool's
// default check must catch that (issue #50). Each kernel's loop count is a launch argument.
#include "common.h"

// Lanes take turns adding into a shared accumulator: in step s, lane s % 4 of each group of
// four adds its value; the others wait (they run the same step in lockstep).
__global__ void lanes_accumulate(float *acc, const float *x, int steps, int n) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  int lane = threadIdx.x & 3, group = t >> 2;
  for (int s = 0; s < steps; ++s)
    if (lane == (s & 3)) acc[group] = acc[group] + x[(group * steps + s) % n];
}

// A warp reduction in shared memory without volatile, over `width` lanes (the pre-Volta idiom).
__global__ void legacy_reduce(float *out, const float *x, int width) {
  __shared__ float s[64];
  int tid = threadIdx.x;
  s[tid] = x[blockIdx.x * blockDim.x + tid];
  s[tid + 32] = 0.0f;
  __syncthreads();
  if (tid < 32)
    for (int off = width / 2; off > 0; off /= 2) s[tid] += s[tid + off];
  if (tid == 0) out[blockIdx.x] = s[0];
}

// Each lane reads what its left neighbour wrote in the previous step, `rounds` times: a
// lane-ordered scan through global memory.
__global__ void lane_ordered(int *v, int rounds) {
  int lane = threadIdx.x & 31, base = blockIdx.x * 32;
  for (int r = 0; r < rounds; ++r)
    if (lane > 0) v[base + lane] = v[base + lane] + v[base + lane - 1];
}

int main() {
  const int n = 1 << 16, blocks = n / 32;
  static float x[n], acc[n / 4], out[blocks];
  static int v[n];
  fill_uniform(x, n, 7);
  float *dx = to_device(x, n), *dacc, *dout;
  CHECK(cudaMalloc(&dacc, sizeof acc));
  CHECK(cudaMalloc(&dout, sizeof out));
  for (int i = 0; i < n; ++i) v[i] = i % 7;
  int *dv = to_device(v, n);
  for (int rep = 0; rep < 3; ++rep) {
    CHECK(cudaMemset(dacc, 0, sizeof acc));
    lanes_accumulate<<<n / 256, 256>>>(dacc, dx, 8, n);
    CHECK_LAUNCH();
    legacy_reduce<<<blocks, 32>>>(dout, dx, 32);
    CHECK_LAUNCH();
  }
  lane_ordered<<<blocks, 32>>>(dv, 4);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(acc, dacc, sizeof acc, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(v, dv, sizeof v, cudaMemcpyDeviceToHost));
  print_checksum("lanes_accumulate", acc, sizeof acc);
  print_checksum("legacy_reduce", out, sizeof out);
  print_checksum("lane_ordered", v, sizeof v);
  return 0;
}
