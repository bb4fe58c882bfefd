/* The shim's hit path on the CPU: what pick() costs for a launch its table serves, apart from
 * the driver (a fake cuCtxGetCurrent; no launch). Built with the shim's sources as the shim
 * is (-O2) by bench/micro/hitpath_bench.py, which runs it and records the results. It includes cuda_launch.c
 * itself, so that pick() and the launch wrapper are the inlined code an app runs.
 *   hitpath ITERATIONS FOLDED_ARGS ARG_BYTES DIMS_IN_KEY [EVICT_KB [COMPILING]]
 * One kernel of FOLDED_ARGS folded arguments of ARG_BYTES each (plus one unfolded pointer),
 * block (bit 0) and grid (bit 1) in the key as DIMS_IN_KEY says; every launch a new value of
 * the pointer, as a step counter's unfolded argument. Prints "ns_per_hit X" five times.
 *
 * Back to back, every line pick() reads stays in the L1 cache. In an app it does not: on the
 * H100 host a hit cost 260 ns inside changing_scalars against 76 ns here, since the driver's
 * launch call (4 us) and the app's own work run between two launches. With EVICT_KB, each
 * launch goes through the shim's whole launch wrapper into a stand-in for the driver that writes
 * EVICT_KB KiB of other memory, one byte per cache line, then the "app" computes for 2 us; the
 * time from the wrapper's entry to the stand-in's (pick(), the clock's own cost taken off) is
 * what is counted. With COMPILING=1 the launches' variant is still compiling in the background
 * (PROTEUS_ASYNC_COMPILATION=auto, the default): each runs the original, through what a cold
 * run's launches go through until the variant arrives (await_variant; the stream never busy). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_launch.c"

static CUresult fake_ctx(CUcontext *c) {
  *c = (CUcontext)0x77;
  return CUDA_SUCCESS;
}

static size_t evict_bytes;
static volatile uint8_t *junk;
static uint64_t entered_ns;
static long served;
static CUfunction served_fn = (CUfunction)0x42;
static CUresult fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, CUstream s, void **params, void **extra) {
  entered_ns = now_ns();
  served += f == served_fn;
  for (size_t off = 0; off < evict_bytes; off += 64) junk[off]++;
  return CUDA_SUCCESS;
}

static void app_work(uint64_t ns) {   /* the host's computation between launches: a few hot lines */
  static volatile uint32_t acc[256];
  uint64_t end = now_ns() + ns;
  for (uint32_t i = 0; now_ns() < end; i++) acc[i & 255] += i;
}

int main(int argc, char **argv) {
  if (argc < 5 || argc > 7) {
    fprintf(stderr, "usage: hitpath ITERATIONS FOLDED_ARGS ARG_BYTES DIMS_IN_KEY [EVICT_KB [COMPILING]]\n");
    return 2;
  }
  long iters = atol(argv[1]);
  int folded = atoi(argv[2]), bytes = atoi(argv[3]), dims = atoi(argv[4]);
  long evict_kb = argc >= 6 ? atol(argv[5]) : 0;
  int compiling = argc == 7 ? atoi(argv[6]) : 0;
  if (iters < 1 || folded < 0 || folded + 1 > MAX_PARAMS || (bytes != 4 && bytes != 8) || dims < 0 || dims > 3 || evict_kb < 0 ||
      compiling < 0 || compiling > 1 || (compiling && !evict_kb)) {
    fprintf(stderr, "hitpath: bad arguments\n");
    return 2;
  }
  static kinfo ki;
  ki.nparams = (uint32_t)folded + 1;
  ki.sizes[0] = 8;   /* the unfolded pointer */
  for (int i = 1; i <= folded; i++) {
    ki.sizes[i] = (uint32_t)bytes;
    atomic_store(&ki.fold[i], 1);
  }
  atomic_store(&ki.dims_in_key, (uint32_t)dims);
  atomic_store(&ki.state, K_ACTIVE);
  ki.name = "k";
  pthread_mutex_lock(&reg_lock);
  handle_insert((void *)0x1000, &ki, NULL);
  pthread_mutex_unlock(&reg_lock);
  real_cuCtxGetCurrent = fake_ctx;
  uint64_t values[MAX_PARAMS] = {0};
  void *params[MAX_PARAMS];
  for (int i = 0; i <= folded; i++) {
    values[i] = 1000u + (uint64_t)i;
    params[i] = &values[i];
  }
  dim3 grid = {16, 1, 1}, block = {256, 1, 1};
  uint8_t key[MAX_KEY];
  int len = stable_key(&ki, params, grid, block, key);
  if (len < 0) {
    fprintf(stderr, "hitpath: key too long\n");
    return 2;
  }
  variant_insert(new_entry(&ki, (CUcontext)0x77, key, len, compiling ? NULL : (CUfunction)0x42, compiling));
  g_async = ASYNC_AUTO;
  CUfunction want = compiling ? (CUfunction)0x1000 : (CUfunction)0x42;   /* the original, or the variant */
  kinfo *out;
  trial_ticket tk = {0};
  served_fn = want;
  evict_bytes = (size_t)evict_kb * 1024;
  if (evict_bytes && !(junk = calloc(1, evict_bytes))) return 2;
  uint64_t clock_ns = UINT64_MAX;   /* two clock reads back to back, at their fastest */
  for (int i = 0; i < 1000; i++) {
    uint64_t a = now_ns(), b = now_ns();
    if (b - a < clock_ns) clock_ns = b - a;
  }
  for (int rep = 0; rep < 5; rep++) {
    uint64_t t0 = now_ns(), picked = 0;
    for (long i = 0; i < iters; i++) {
      values[0] = (uint64_t)i;
      if (evict_bytes) {
        uint64_t a = now_ns();
        launch_with(fake_launch, (CUfunction)0x1000, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0, NULL, params, NULL);
        picked += entered_ns - a - clock_ns;
        app_work(2000);
      } else {
        served += pick((void *)0x1000, params, grid, block, NULL, &out, &tk) == (CUfunction)0x42;
        sample_poll(out);
      }
    }
    printf("ns_per_hit %.2f\n", (double)(evict_bytes ? picked : now_ns() - t0) / (double)iters);
  }
  printf("key_bytes %d\n", len);
  return served == 5 * iters ? 0 : 1;
}
