// HIP port of samples/src/driver_api.cpp: the module API only. hipModuleLoadData on an
// offload bundle the app carries in its own .hip_fatbin section, hipModuleGetFunction,
// hipModuleGetGlobal, hipModuleLaunchKernel. No <<<>>>, no kernel registered by the compiler.
#include <hip/hip_runtime_api.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" const unsigned char proteus_sample_bundle[];  // module_api_bundle.s

#define CK(call)                                                                      \
  do {                                                                                \
    hipError_t r_ = (call);                                                           \
    if (r_ != hipSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, hipGetErrorString(r_)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static uint64_t fnv1a(const void *data, size_t bytes) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) { h ^= p[i]; h *= 1099511628211ull; }
  return h;
}

int main() {
  hipModule_t mod;
  CK(hipModuleLoadData(&mod, proteus_sample_bundle));
  hipFunction_t fn;
  CK(hipModuleGetFunction(&fn, mod, "scale_loop"));
  hipDeviceptr_t bias_ptr;
  size_t bias_size;
  CK(hipModuleGetGlobal(&bias_ptr, &bias_size, mod, "bias"));
  float bias = 0.125f;
  CK(hipMemcpyHtoD(bias_ptr, &bias, sizeof bias));

  int n = 1 << 20, reps = 10;
  float factor = 0.75f;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = (float)(i % 1000) / 1000.0f - 0.5f;
  float *dv;
  CK(hipMalloc(&dv, n * sizeof(float)));
  CK(hipMemcpy(dv, host.data(), n * sizeof(float), hipMemcpyHostToDevice));
  void *args[] = {&dv, &n, &reps, &factor};
  for (int rep = 0; rep < 3; ++rep)
    CK(hipModuleLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CK(hipDeviceSynchronize());
  CK(hipMemcpy(host.data(), dv, n * sizeof(float), hipMemcpyDeviceToHost));
  printf("checksum scale_loop %016llx\n", (unsigned long long)fnv1a(host.data(), n * sizeof(float)));
  CK(hipFree(dv));
  CK(hipModuleUnload(mod));
  return 0;
}
