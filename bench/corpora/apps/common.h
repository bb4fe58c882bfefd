// Shared by the benchmark workloads (bench/apps/*.cu): error checks, deterministic inputs,
// result checksums, per-kernel GPU timing and the command line.
//
// Output conventions, parsed by bench/run.py:
//   checksum <label> <16 hex digits>   FNV-1a of the exact result bytes (compared across runs)
//   verify <label> ok|FAILED <detail>  the app's own check against a CPU reference
//   kernel_ms <kernel> <total ms> <launches>   GPU time of that kernel's launches (CUDA events)
// An app exits 1 when its verification fails.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <algorithm>
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

// Deterministic pseudo-random numbers (a 64-bit LCG with a splitmix finalizer): the same on
// every run and machine, with no hidden library state.
struct HostRng {
  uint64_t s;
  explicit HostRng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
};

template <typename T> static T *to_device(const T *host, size_t n) {
  T *d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(T)));
  CHECK(cudaMemcpy(d, host, n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T> static T *to_device(const std::vector<T> &host) { return to_device(host.data(), host.size()); }

template <typename T> static void to_host(T *host, const T *dev, size_t n) {
  CHECK(cudaMemcpy(host, dev, n * sizeof(T), cudaMemcpyDeviceToHost));
}

// Relative comparison for the CPU reference checks.
static inline bool close_enough(double got, double want, double rel, double abs_tol) {
  return std::isfinite(got) && std::fabs(got - want) <= abs_tol + rel * std::fabs(want);
}

// Per-kernel GPU time: a pair of CUDA events around every launch, on the default stream.
// Elapsed times are collected in batches (one synchronization per batch), so the events
// never throttle the launch queue by more than that. Each kernel's first launch is left out:
// its events also hold whatever the host did between them the first time (module loading,
// and under the JIT the embedded Python's start and the first specialization), which is
// start-up cost, seen in the wall time, not kernel time.
class KernelTimer {
 public:
  ~KernelTimer() {
    for (auto &e : pool_) cudaEventDestroy(e);
  }
  void start(const char *name) {
    current_ = slot(name);
    pending_.push_back({current_, event(), event()});
    CHECK(cudaEventRecord(pending_.back().start));
  }
  void stop() {
    CHECK(cudaGetLastError());  // a launch error (bad configuration) shows here
    CHECK(cudaEventRecord(pending_.back().stop));
    if (pending_.size() >= 512) flush();
  }
  void flush() {
    if (pending_.empty()) return;
    CHECK(cudaEventSynchronize(pending_.back().stop));
    for (auto &p : pending_) {
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
      if (!totals_[p.kernel].seen++) continue;  // the first launch: start-up, see above
      totals_[p.kernel].ms += ms;
      totals_[p.kernel].launches += 1;
    }
    pending_.clear();
    used_ = 0;
  }
  void print() {
    flush();
    for (auto &t : totals_) printf("kernel_ms %s %.3f %ld\n", t.name.c_str(), t.ms, t.launches);
  }

 private:
  struct Total { std::string name; double ms = 0; long launches = 0, seen = 0; };
  struct Pending { int kernel; cudaEvent_t start, stop; };
  int slot(const char *name) {
    for (size_t i = 0; i < totals_.size(); ++i)
      if (totals_[i].name == name) return (int)i;
    totals_.push_back({name});
    return (int)totals_.size() - 1;
  }
  cudaEvent_t event() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  std::vector<Total> totals_;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  int current_ = -1;
};

// TIMED(timer, "name", kernel<<<grid, block>>>(args...));
#define TIMED(timer, name, ...)   \
  do {                            \
    (timer).start(name);          \
    __VA_ARGS__;                  \
    (timer).stop();               \
  } while (0)

// Command line: `--scale F` multiplies the app's repetition count (time steps, repeats),
// never a value the kernels see, so the work grows linearly and the specializations stay
// the same; `--NAME VALUE` sets a named integer option.
struct Options {
  double scale = 1.0;
  std::vector<std::pair<std::string, long>> ints;
  Options(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) {
      if (strncmp(argv[i], "--", 2) != 0 || i + 1 >= argc) {
        fprintf(stderr, "usage: %s [--scale F] [--NAME INT]...\n", argv[0]);
        exit(2);
      }
      std::string key = argv[i] + 2;
      const char *value = argv[++i];
      if (key == "scale") scale = atof(value);
      else ints.push_back({key, atol(value)});
    }
    if (!(scale > 0)) {
      fprintf(stderr, "--scale must be positive\n");
      exit(2);
    }
  }
  long get(const char *key, long fallback) const {
    for (auto &kv : ints)
      if (kv.first == key) return kv.second;
    return fallback;
  }
  long reps(long base) const {  // a repetition count times --scale, at least 1
    long r = (long)std::llround(base * scale);
    return r < 1 ? 1 : r;
  }
};

static inline int report_verification(const char *label, bool ok, const char *detail) {
  printf("verify %s %s %s\n", label, ok ? "ok" : "FAILED", detail);
  return ok ? 0 : 1;
}
