// A scalar that changes from launch to launch, from one thread or from several threads on
// their own streams, with the results checked on the host.
//   changing_scalars [LAUNCHES=1000] [DISTINCT=16] [THREADS=1] [N=4096] [CHECK_EVERY=1]
// Launch j passes k = j % DISTINCT (+ the thread's id): with every scalar folded, DISTINCT
// variants per thread. Each launch updates N elements; the host recomputes every
// CHECK_EVERY-th of them (the default, all: the host's work dominates; a large N with a sparse
// check makes the GPU's work dominate, as in a time-stepping code). Prints "verified" and a
// checksum of all N elements; exits 1 on any wrong element. With SAMPLE_TIMES=1 in the
// environment it also writes, to stderr, how long creating the CUDA context and the work (the
// launches, the copy back and the check) took: a benchmark reads the phase the JIT acts in
// apart from the context's creation, which varies by tens of milliseconds from run to run;
// and, inside the work, the time spent in launch calls against the host's own computation,
// and the launch calls that took over 0.2 ms (a stall behind a lock, not a slower CPU).
#include "common.h"
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

__global__ void accumulate_step(unsigned *acc, int n, int k, unsigned salt) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned v = (unsigned)i * (unsigned)(k + 1);
  for (int r = 0; r < (k & 3) + 1; ++r) v = (v ^ salt) * 2654435761u + (unsigned)r;
  acc[i] += v;
}

static unsigned expected_step(int i, int k, unsigned salt) {
  unsigned v = (unsigned)i * (unsigned)(k + 1);
  for (int r = 0; r < (k & 3) + 1; ++r) v = (v ^ salt) * 2654435761u + (unsigned)r;
  return v;
}

using sclock = std::chrono::steady_clock;
static bool g_times;
static struct {
  std::mutex lock;
  double launch_ms = 0, compute_ms = 0, stall_ms = 0, max_ms = 0;
  long stalls = 0;
} g_split;

static double ms(sclock::time_point a, sclock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

static bool run_worker(int id, int launches, int distinct, int n, int every, uint64_t *checksum) {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  unsigned *d;
  CHECK(cudaMalloc(&d, (size_t)n * sizeof(unsigned)));
  CHECK(cudaMemsetAsync(d, 0, (size_t)n * sizeof(unsigned), s));
  std::vector<unsigned> want((n + every - 1) / every, 0);
  double launch_ms = 0, compute_ms = 0, stall_ms = 0, max_ms = 0;
  long stalls = 0;
  for (int j = 0; j < launches; ++j) {
    int k = j % distinct + id;
    unsigned salt = 0x9e3779b9u * (unsigned)(id + 1);
    sclock::time_point t0, t1;
    if (g_times) t0 = sclock::now();
    accumulate_step<<<(n + 255) / 256, 256, 0, s>>>(d, n, k, salt);
    CHECK(cudaGetLastError());
    if (g_times) t1 = sclock::now();
    for (int i = 0; i < n; i += every) want[i / every] += expected_step(i, k, salt);
    if (g_times) {
      double l = ms(t0, t1);
      launch_ms += l;
      compute_ms += ms(t1, sclock::now());
      if (l > 0.2) { stalls++; stall_ms += l; }
      if (l > max_ms) max_ms = l;
    }
  }
  if (g_times) {
    std::lock_guard<std::mutex> hold(g_split.lock);
    g_split.launch_ms += launch_ms; g_split.compute_ms += compute_ms; g_split.stall_ms += stall_ms;
    g_split.stalls += stalls;
    if (max_ms > g_split.max_ms) g_split.max_ms = max_ms;
  }
  std::vector<unsigned> got(n);
  CHECK(cudaMemcpyAsync(got.data(), d, (size_t)n * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaFree(d));
  CHECK(cudaStreamDestroy(s));
  *checksum = fnv1a(got.data(), (size_t)n * sizeof(unsigned));
  for (int i = 0; i < n; i += every)
    if (got[i] != want[i / every]) {
      fprintf(stderr, "thread %d: element %d is %u, expected %u\n", id, i, got[i], want[i / every]);
      return false;
    }
  return true;
}

int main(int argc, char **argv) {
  int launches = argc > 1 ? atoi(argv[1]) : 1000;
  int distinct = argc > 2 ? atoi(argv[2]) : 16;
  int threads = argc > 3 ? atoi(argv[3]) : 1;
  int n = argc > 4 ? atoi(argv[4]) : 4096;
  int every = argc > 5 ? atoi(argv[5]) : 1;
  if (launches < 1 || distinct < 1 || threads < 1 || n < 1 || every < 1) {
    fprintf(stderr, "usage: changing_scalars [LAUNCHES] [DISTINCT] [THREADS] [N] [CHECK_EVERY], all positive\n");
    return 2;
  }
  const char *times = getenv("SAMPLE_TIMES");
  g_times = times && times[0] == '1';
  auto t0 = sclock::now();
  CHECK(cudaFree(0));  // create the context before the threads start
  auto t1 = sclock::now();
  std::vector<std::thread> pool;
  std::vector<uint64_t> sums(threads);
  std::vector<char> ok(threads, 0);
  int per = launches / threads;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { ok[t] = run_worker(t, per, distinct, n, every, &sums[t]); });
  for (auto &th : pool) th.join();
  auto t2 = sclock::now();
  if (g_times)
    fprintf(stderr, "times: context %.3f ms, work %.3f ms, launch calls %.3f ms, host computation %.3f ms, "
                    "launch calls over 0.2 ms %ld taking %.3f ms, longest %.3f ms\n",
            ms(t0, t1), ms(t1, t2), g_split.launch_ms, g_split.compute_ms, g_split.stalls, g_split.stall_ms, g_split.max_ms);
  uint64_t total = 0;
  for (int t = 0; t < threads; ++t) {
    if (!ok[t]) return 1;
    total ^= sums[t] + (uint64_t)t;
  }
  printf("verified %d launches on %d thread(s)\n", per * threads, threads);
  printf("checksum accumulate %016llx\n", (unsigned long long)total);
  return 0;
}
