// An app that uses the CUDA driver API directly: cuModuleLoadData on a fat binary it
// carries in its own .nv_fatbin section, cuModuleGetFunction, cuModuleGetGlobal,
// cuLaunchKernel. No CUDA runtime at all.
#include <cuda.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" const unsigned char proteus_sample_fatbin[];  // driver_api_fatbin.s

#define CK(call)                                                                    \
  do {                                                                              \
    CUresult r_ = (call);                                                           \
    if (r_ != CUDA_SUCCESS) {                                                       \
      const char *s_ = nullptr;                                                     \
      cuGetErrorString(r_, &s_);                                                    \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?"); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

static uint64_t fnv1a(const void *data, size_t bytes) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) { h ^= p[i]; h *= 1099511628211ull; }
  return h;
}

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmodule mod;
  CK(cuModuleLoadData(&mod, proteus_sample_fatbin));
  CUfunction fn;
  CK(cuModuleGetFunction(&fn, mod, "scale_loop"));
  CUdeviceptr bias_ptr;
  size_t bias_size;
  CK(cuModuleGetGlobal(&bias_ptr, &bias_size, mod, "bias"));
  float bias = 0.125f;
  CK(cuMemcpyHtoD(bias_ptr, &bias, sizeof bias));

  int n = 1 << 20, reps = 10;
  float factor = 0.75f;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = (float)(i % 1000) / 1000.0f - 0.5f;
  CUdeviceptr dv;
  CK(cuMemAlloc(&dv, n * sizeof(float)));
  CK(cuMemcpyHtoD(dv, host.data(), n * sizeof(float)));
  void *args[] = {&dv, &n, &reps, &factor};
  for (int rep = 0; rep < 3; ++rep)
    CK(cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CK(cuCtxSynchronize());
  CK(cuMemcpyDtoH(host.data(), dv, n * sizeof(float)));
  printf("checksum scale_loop %016llx\n", (unsigned long long)fnv1a(host.data(), n * sizeof(float)));
  CK(cuMemFree(dv));
  CK(cuModuleUnload(mod));
  CK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
