/* Host cost of one launch call of changing_scalars' kernel, by how it was loaded (cuModuleLoadData,
 * cuLibraryLoadData and its CUfunction, its CUkernel; the AOT cubin and a specialized one), and of
 * one cuCtxGetCurrent: what a hit of the shim adds where it asks for the context. Between calls,
 * the sample's own host computation, so caches are as cold as in the app. 15 rounds of 2,000
 * calls per kind, interleaved; median, min and max of the rounds' ns per call.
 *   gcc -O2 -I/usr/local/cuda/include -o launch_handles bench/launch_handles.c -ldl
 *   ./launch_handles ORIG.cubin SPEC.cubin
 * ORIG: the sm_90 ELF of samples/build/changing_scalars' fat binary; SPEC: `proteus-rewrite
 * specialize STORE accumulate_step --arg 1=20000 --arg 3=2654435769 --block 256 --grid 79
 * --emit cubin`. Results: results/launch-handles-2026-11-23-h100.txt. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>

#define D(name) static __typeof__(&name) p_##name;
D(cuInit) D(cuDeviceGet) D(cuDevicePrimaryCtxRetain) D(cuCtxSetCurrent) D(cuModuleLoadData) D(cuModuleGetFunction)
D(cuLibraryLoadData) D(cuLibraryGetKernel) D(cuKernelGetFunction) D(cuLaunchKernel) D(cuMemAlloc) D(cuCtxSynchronize)
D(cuCtxGetCurrent) D(cuStreamCreate) D(cuStreamQuery) D(cuGetProcAddress)

static uint64_t ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }
static void *slurp(const char *p) {
  FILE *f = fopen(p, "rb"); if (!f) { perror(p); exit(2); }
  fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
  void *b = malloc(n); if (fread(b, 1, n, f) != (size_t)n) exit(2); fclose(f); return b;
}
#define C(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s: %d\n", #x, r_); exit(1); } } while (0)
static unsigned want[20000];
static void host_work(int k) {
  unsigned salt = 0x9e3779b9u;
  for (int i = 0; i < 20000; i++) {
    unsigned v = (unsigned)i * (unsigned)(k + 1);
    for (int r = 0; r < (k & 3) + 1; ++r) v = (v ^ salt) * 2654435761u + (unsigned)r;
    want[i] += v;
  }
}
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

static const char *sym(const char *n) {
  static char b[64];
  if (!strcmp(n, "cuMemAlloc") || !strcmp(n, "cuGetProcAddress") || !strcmp(n, "cuCtxGetCurrent") ) { snprintf(b, sizeof b, "%s%s", n, strcmp(n, "cuCtxGetCurrent") ? "_v2" : ""); return b; }
  return n;
}
int main(int argc, char **argv) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
#define L(name) *(void **)&p_##name = dlsym(h, sym(#name)); if (!p_##name) { fprintf(stderr, "no %s\n", #name); return 1; }
  L(cuInit) L(cuDeviceGet) L(cuDevicePrimaryCtxRetain) L(cuCtxSetCurrent) L(cuModuleLoadData) L(cuModuleGetFunction)
  L(cuLibraryLoadData) L(cuLibraryGetKernel) L(cuKernelGetFunction) L(cuLaunchKernel) L(cuMemAlloc) L(cuCtxSynchronize)
  L(cuCtxGetCurrent) L(cuStreamCreate) L(cuStreamQuery) L(cuGetProcAddress)
  C(p_cuInit(0)); CUdevice dev; C(p_cuDeviceGet(&dev, 0)); CUcontext ctx; C(p_cuDevicePrimaryCtxRetain(&ctx, dev)); C(p_cuCtxSetCurrent(ctx));
  const char *name = "_Z15accumulate_stepPjiij";
  void *orig = slurp(argv[1]), *spec = slurp(argv[2]);
  CUfunction f[6]; const char *what[6] = {"module orig", "library orig", "kernel orig", "module spec", "library spec", "getproc launch, library orig"};
  CUmodule m; CUlibrary l; CUkernel k;
  C(p_cuModuleLoadData(&m, orig)); C(p_cuModuleGetFunction(&f[0], m, name));
  C(p_cuLibraryLoadData(&l, orig, 0, 0, 0, 0, 0, 0)); C(p_cuLibraryGetKernel(&k, l, name)); C(p_cuKernelGetFunction(&f[1], k)); f[2] = (CUfunction)k;
  C(p_cuModuleLoadData(&m, spec)); C(p_cuModuleGetFunction(&f[3], m, name));
  C(p_cuLibraryLoadData(&l, spec, 0, 0, 0, 0, 0, 0)); C(p_cuLibraryGetKernel(&k, l, name)); C(p_cuKernelGetFunction(&f[4], k));
  f[5] = f[1];
  __typeof__(&cuLaunchKernel) gp = NULL;
  CUdriverProcAddressQueryResult qr;
  C(p_cuGetProcAddress("cuLaunchKernel", (void **)&gp, 12000, 0, &qr));
  CUstream s; C(p_cuStreamCreate(&s, 0));
  CUdeviceptr d; C(p_cuMemAlloc(&d, 20000 * 4));
  int n = 20000; unsigned salt = 0x9e3779b9u;
  enum { ROUNDS = 15, N = 2000, T = 7 };
  static double res[T][ROUNDS];
  for (int round = 0; round < ROUNDS; round++) {
    for (int t0 = 0; t0 < T; t0++) {
      int t = (t0 + round) % T;
      uint64_t sum = 0;
      for (int j = 0; j < N; j++) {
        int kk = j;
        void *args[] = {&d, &n, &kk, &salt};
        host_work(kk);
        uint64_t a = ns();
        if (t == 6) { CUcontext c; p_cuCtxGetCurrent(&c); if (c != ctx) return 3; }
        else if (t == 5) C(gp(f[t], 79, 1, 1, 256, 1, 1, 0, s, args, NULL));
        else C(p_cuLaunchKernel(f[t], 79, 1, 1, 256, 1, 1, 0, s, args, NULL));
        sum += ns() - a;
      }
      C(p_cuCtxSynchronize());
      res[t][round] = (double)sum / N;
    }
  }
  for (int t = 0; t < T; t++) {
    qsort(res[t], ROUNDS, sizeof(double), cmp);
    printf("%-30s median %.0f ns  min %.0f  max %.0f\n", t == 6 ? "cuCtxGetCurrent" : what[t], res[t][ROUNDS / 2], res[t][0], res[t][ROUNDS - 1]);
  }
  return 0;
}
