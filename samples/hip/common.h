// HIP counterpart of samples/src/common.h: error checking, deterministic inputs and the same
// FNV-1a checksum lines, so a HIP run can be compared with the native run byte for byte.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <hip/hip_runtime.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    hipError_t err_ = (call);                                                         \
    if (err_ != hipSuccess) {                                                         \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
              hipGetErrorString(err_));                                               \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

#define CHECK_LAUNCH()                                                                \
  do {                                                                                \
    CHECK(hipGetLastError());                                                         \
    CHECK(hipDeviceSynchronize());                                                    \
  } while (0)

static inline uint64_t fnv1a(const void *data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static inline void print_checksum(const char *label, const void *data, size_t bytes) {
  printf("checksum %s %016llx\n", label, (unsigned long long)fnv1a(data, bytes));
}

static inline void fill_uniform(float *v, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = (float)((s >> 8) & 0xFFFFFF) / (float)0x800000 - 1.0f;
  }
}

static inline void fill_uniform(double *v, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = (double)((s >> 8) & 0xFFFFFF) / (double)0x800000 - 1.0;
  }
}

template <typename T> static T *to_device(const T *host, size_t n) {
  T *d = nullptr;
  CHECK(hipMalloc(&d, n * sizeof(T)));
  CHECK(hipMemcpy(d, host, n * sizeof(T), hipMemcpyHostToDevice));
  return d;
}

template <typename T> static void to_host(T *host, const T *dev, size_t n) {
  CHECK(hipMemcpy(host, dev, n * sizeof(T), hipMemcpyDeviceToHost));
}
