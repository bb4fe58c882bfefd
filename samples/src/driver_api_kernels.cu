// Device code of the driver_api app: built by clang with --cuda-device-only and
// -fembed-bitcode into a fat binary that the app embeds in its own .nv_fatbin section.
extern "C" __device__ float bias;   // set by the host through cuModuleGetGlobal

extern "C" __global__ void scale_loop(float *v, int n, int reps, float factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = v[i];
  for (int r = 0; r < reps; ++r) x = x * factor + bias;
  v[i] = x;
}

__device__ float bias;

// The same without a device variable: its variants may serve every context (`contexts` mode).
extern "C" __global__ void scale_plain(float *v, int n, int reps, float factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = v[i];
  for (int r = 0; r < reps; ++r) x = x * factor + 0.25f;
  v[i] = x;
}
