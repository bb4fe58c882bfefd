// An app that uses the CUDA driver API directly: cuModuleLoadData on a fat binary it
// carries in its own .nv_fatbin section, cuModuleGetFunction, cuModuleGetGlobal,
// cuLaunchKernel. No CUDA runtime at all.
//   driver_api            one context (the device's primary one)
//   driver_api contexts   scale_loop and scale_plain (no device variable) in the primary
//                         context, then in a second one with the module loaded there too
#include <cuda.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

static CUmodule load(float bias) {
  CUmodule mod;
  CK(cuModuleLoadData(&mod, proteus_sample_fatbin));
  CUdeviceptr bias_ptr;
  size_t bias_size;
  CK(cuModuleGetGlobal(&bias_ptr, &bias_size, mod, "bias"));
  CK(cuMemcpyHtoD(bias_ptr, &bias, sizeof bias));
  return mod;
}

// Runs `kernel` (scale_loop or scale_plain) of `mod`, loaded in the current context, and
// prints the checksum under `label`.
static void run(CUmodule mod, const char *kernel, const char *label) {
  CUfunction fn;
  CK(cuModuleGetFunction(&fn, mod, kernel));
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
  printf("checksum %s %016llx\n", label, (unsigned long long)fnv1a(host.data(), n * sizeof(float)));
  CK(cuMemFree(dv));
}

int main(int argc, char **argv) {
  bool contexts = argc > 1 && !strcmp(argv[1], "contexts");
  if (argc > 1 && !contexts) {
    fprintf(stderr, "usage: driver_api [contexts]\n");
    return 2;
  }
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmodule mod = load(0.125f);
  run(mod, "scale_loop", "scale_loop");
  if (contexts) {   // the second context's module is loaded while the first's still is
    run(mod, "scale_plain", "scale_plain");
    CUcontext second;
    CK(cuCtxCreate(&second, nullptr, 0, dev));   // current from here on
    CUmodule mod2 = load(0.5f);                   // its own `bias`, with another value
    run(mod2, "scale_loop", "scale_loop_second_context");
    run(mod2, "scale_plain", "scale_plain_second_context");
    CK(cuModuleUnload(mod2));
    CK(cuCtxSetCurrent(ctx));
    CK(cuCtxDestroy(second));
  }
  CK(cuModuleUnload(mod));
  CK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
