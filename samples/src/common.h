// Shared by the sample apps: error checking, deterministic inputs and a result checksum.
// Every app prints "checksum <label> <16 hex digits>" lines: an FNV-1a hash of the exact
// result bytes, so a JIT run can be compared with the native run byte for byte.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) {                                                        \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
              cudaGetErrorString(err_));                                              \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

// After a launch: a launch error (bad configuration) or a fault during the kernel.
#define CHECK_LAUNCH()                                                                \
  do {                                                                                \
    CHECK(cudaGetLastError());                                                        \
    CHECK(cudaDeviceSynchronize());                                                   \
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

// Deterministic pseudo-random values in [-1, 1): the same on every run and machine.
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
  CHECK(cudaMalloc(&d, n * sizeof(T)));
  CHECK(cudaMemcpy(d, host, n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T> static void to_host(T *host, const T *dev, size_t n) {
  CHECK(cudaMemcpy(host, dev, n * sizeof(T), cudaMemcpyDeviceToHost));
}
