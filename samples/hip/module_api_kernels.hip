// Device code of the module_api app: built with -fembed-bitcode into an offload bundle that
// the app embeds in its own .hip_fatbin section and loads with hipModuleLoadData.
#include <hip/hip_runtime.h>

extern "C" __device__ float bias;   // set by the host through hipModuleGetGlobal

extern "C" __global__ void scale_loop(float *v, int n, int reps, float factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = v[i];
  for (int r = 0; r < reps; ++r) x = x * factor + bias;
  v[i] = x;
}

__device__ float bias;
