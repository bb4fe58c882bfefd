/* The shim's hit path on the CPU: what pick() costs for a launch its table serves, apart from
 * the driver (a fake cuCtxGetCurrent; no launch). Built from shim/proteus_shim.c as the shim
 * is (-O2) by bench/hitpath_bench.py, which runs it and records the results.
 *   hitpath ITERATIONS FOLDED_ARGS ARG_BYTES DIMS_IN_KEY
 * One kernel of FOLDED_ARGS folded arguments of ARG_BYTES each (plus one unfolded pointer),
 * block (bit 0) and grid (bit 1) in the key as DIMS_IN_KEY says; every launch a new value of
 * the pointer, as a step counter's unfolded argument. Prints "ns_per_hit X" five times. */
#include "proteus_shim.c"

static CUresult fake_ctx(CUcontext *c) { *c = (CUcontext)0x77; return CUDA_SUCCESS; }

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: hitpath ITERATIONS FOLDED_ARGS ARG_BYTES DIMS_IN_KEY\n"); return 2; }
  long iters = atol(argv[1]);
  int folded = atoi(argv[2]), bytes = atoi(argv[3]), dims = atoi(argv[4]);
  if (iters < 1 || folded < 0 || folded + 1 > MAX_PARAMS || (bytes != 4 && bytes != 8) || dims < 0 || dims > 3) {
    fprintf(stderr, "hitpath: bad arguments\n");
    return 2;
  }
  static kinfo ki;
  ki.nparams = (uint32_t)folded + 1;
  ki.sizes[0] = 8;   /* the unfolded pointer */
  for (int i = 1; i <= folded; i++) { ki.sizes[i] = (uint32_t)bytes; atomic_store(&ki.fold[i], 1); }
  atomic_store(&ki.dims_in_key, (uint32_t)dims);
  atomic_store(&ki.state, K_ACTIVE);
  ki.name = "k";
  pthread_mutex_lock(&reg_lock);
  handle_insert((void *)0x1000, &ki, NULL);
  pthread_mutex_unlock(&reg_lock);
  real_cuCtxGetCurrent = fake_ctx;
  uint64_t values[MAX_PARAMS] = {0};
  void *params[MAX_PARAMS];
  for (int i = 0; i <= folded; i++) { values[i] = 1000u + (uint64_t)i; params[i] = &values[i]; }
  dim3 grid = {16, 1, 1}, block = {256, 1, 1};
  uint8_t key[MAX_KEY];
  int len = stable_key(&ki, params, grid, block, key);
  if (len < 0) { fprintf(stderr, "hitpath: key too long\n"); return 2; }
  variant_insert(new_entry(&ki, (CUcontext)0x77, key, len, (CUfunction)0x42, 0));
  kinfo *out;
  long served = 0;
  for (int rep = 0; rep < 5; rep++) {
    uint64_t t0 = now_ns();
    for (long i = 0; i < iters; i++) {
      values[0] = (uint64_t)i;
      served += pick((void *)0x1000, params, grid, block, NULL, &out) == (CUfunction)0x42;
      sample_poll(out);
    }
    printf("ns_per_hit %.2f\n", (double)(now_ns() - t0) / (double)iters);
  }
  printf("key_bytes %d\n", len);
  return served == 5 * iters ? 0 : 1;
}
