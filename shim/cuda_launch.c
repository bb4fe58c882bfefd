/* libproteus.so, CUDA: the launch path. Every way a kernel is launched (the driver's
 * cuLaunchKernel, cuLaunchKernelEx and cooperative launches, per-thread-stream variants, the
 * dynamic runtime's cudaLaunchKernel and cudaLaunchKernelExC) asks `pick` for the function to
 * launch: the hit path (hitpath.h: no lock, no allocation, no Python) or the core's miss path
 * (jobs.c); a speed trial's turn and a variant's check (trial.c, check.c, cuda_validate.c)
 * wrap the launch; a failed variant launch runs the original. The entry points are wrapped in
 * cuda.c (cuGetProcAddress, dlsym). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cuda_api.h"
#include "hitpath.h"
#include "shim.h"

/* A miss, out of line: the process's platform is CUDA (gpu_claim), or the original runs. */
__attribute__((noinline, cold)) static CUfunction cuda_miss(const void *handle, void **params, dim3 grid, dim3 block,
                                                            CUstream stream, kinfo *ki, CUcontext ctx, int ctx_free) {
  if (gpu_claim(&cuda_ops)) return pick_miss(handle, params, grid, block, stream, ki, ctx, ctx_free);
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
  return NULL;
}

/* The specialized function for this launch, or NULL to run the original. A hit stays in this
 * function and what it inlines (the hit path: lock-free, no allocation, no Python); a miss or
 * a variant still compiling goes out of line, so the hit's code stays short and together. */
static CUfunction pick(const void *handle, void **params, dim3 grid, dim3 block, CUstream stream, kinfo **kio, trial_ticket *tk) {
  read_env();
  if (g_disable) return NULL;
  kinfo *ki = launched_kernel(handle, grid, block);
  *kio = ki;
  if (!ki) return NULL;
  int state = atomic_load_explicit(&ki->state, memory_order_acquire);
  CUcontext ctx = NULL;
  /* NULL parameters: a kernel that takes none may be launched so (cudaLaunchKernel(f, g, b, NULL,
   * ...)); one that takes some is being launched through `extra`, left to the original */
  if (state == K_DISABLED || (!params && state == K_ACTIVE && ki->nparams)) goto original;
  /* A context-free kernel's hit needs no context: where there is none, the variant's launch
   * fails as the original's would, and the original runs and answers. */
  int ctx_free = state == K_ACTIVE && ki->ctx_free;
  if (!ctx_free && (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) goto original;
  if (__builtin_expect(atomic_load_explicit(&captures_open, memory_order_relaxed) != 0, 0) && stream_capturing(stream)) {
    atomic_fetch_add_explicit(&ki->captured, 1, memory_order_relaxed);
    return NULL;
  }
  if (state == K_ACTIVE) {   /* the hot path: key, last hit or probe, launch */
    uint8_t key[MAX_KEY];
    int len = stable_key(ki, params, grid, block, key);
    if (len == -1) goto original;
    sentry *e = len < 0 ? NULL : find_variant(ki, ctx, key, len);
    if (e) {
      CUfunction fn = atomic_load_explicit(&e->fn, memory_order_acquire);
      if (__builtin_expect(fn != NULL, 1)) {
        if (__builtin_expect(atomic_load_explicit(&e->trial, memory_order_relaxed) != NULL, 0)) return trial_pick(ki, e, fn, tk);
        atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
        return fn;
      }
      if (atomic_load_explicit(&e->pending, memory_order_acquire)) return pick_compiling(ki, e, stream, 0);
      if (atomic_load_explicit(&e->check, memory_order_acquire)) return check_pick(ki, e);
      goto original;
    }
  }
  return cuda_miss(handle, params, grid, block, stream, ki, ctx, ctx_free);
original:
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
  return NULL;
}


/* Set while the runtime launches a kernel we left to it: its driver-level launch is then
 * the same launch, already decided, and passes straight through. */
static __thread int in_runtime_launch
    __attribute__((tls_model("initial-exec")));   /* read on every launch: no __tls_get_addr call */

static CUresult launch_with(CUresult (*real)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                             CUstream, void **, void **),
                            CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, CUstream s, void **params, void **extra) {
  if (in_runtime_launch) return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  kinfo *ki = NULL;
  /* the per-thread default stream has a handle of its own for event records and queries */
  CUstream es = !s && real == real_cuLaunchKernel_ptsz ? (CUstream)0x2 : s;
  trial_ticket tk = {0};
  CUfunction sf = pick(f, params, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, es, &ki, &tk);
  int checking = __builtin_expect(check_entry != NULL, 0) && sf;
  if (checking) sf = validate_begin(ki, sf, f, params, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, shmem, s, real);
  sample_poll(ki);
  int sampled = sample_begin(ki, es, &tk);
  CUresult r = sf ? real(sf, gx, gy, gz, bx, by, bz, shmem, s, params, extra) : 1;
  if (sf && r != CUDA_SUCCESS) launch_error(f);
  if (r != CUDA_SUCCESS) r = real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  sample_end(ki, es, sampled, &tk);
  if (__builtin_expect(checking, 0)) validate_end();
  prefetch_hit(f, ki);
  return r;
}

CUresult w_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shmem, CUstream s, void **params, void **extra) {
  return launch_with(real_cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
CUresult w_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shmem, CUstream s, void **params, void **extra) {
  return launch_with(real_cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

static CUresult launch_ex_with(CUresult (*real)(const CUlaunchConfig *, CUfunction, void **, void **), const CUlaunchConfig *c,
                               CUfunction f, void **params, void **extra) {
  kinfo *ki = NULL;
  trial_ticket tk = {0};
  CUstream es = c && !c->hStream && real == real_cuLaunchKernelEx_ptsz ? (CUstream)0x2 : c ? c->hStream : NULL;
  CUfunction sf = c && !in_runtime_launch ? pick(f, params, (dim3){c->gridDimX, c->gridDimY, c->gridDimZ},
                                                 (dim3){c->blockDimX, c->blockDimY, c->blockDimZ}, es, &ki, &tk)
                                          : NULL;
  int checking = __builtin_expect(check_entry != NULL, 0) && sf;
  if (checking)
    sf = c->numAttrs ? validate_refuse(ki, "launched with cuLaunchKernelEx attributes, which validation does not repeat")
                     : validate_begin(ki, sf, f, params, (dim3){c->gridDimX, c->gridDimY, c->gridDimZ},
                                      (dim3){c->blockDimX, c->blockDimY, c->blockDimZ}, c->sharedMemBytes, c->hStream,
                                      real == real_cuLaunchKernelEx_ptsz ? real_cuLaunchKernel_ptsz : real_cuLaunchKernel);
  sample_poll(ki);
  int sampled = sample_begin(ki, es, &tk);
  CUresult r = sf ? real(c, sf, params, extra) : 1;
  if (sf && r != CUDA_SUCCESS) launch_error(f);
  if (r != CUDA_SUCCESS) r = real(c, f, params, extra);
  sample_end(ki, es, sampled, &tk);
  if (__builtin_expect(checking, 0)) validate_end();
  prefetch_hit(f, ki);
  return r;
}
CUresult w_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  return launch_ex_with(real_cuLaunchKernelEx, c, f, p, e);
}
CUresult w_cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  return launch_ex_with(real_cuLaunchKernelEx_ptsz, c, f, p, e);
}

static CUresult coop_with(CUresult (*real)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                           CUstream, void **),
                          CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shmem, CUstream s, void **params) {
  kinfo *ki = NULL;
  CUstream es = !s && real == real_cuLaunchCooperativeKernel_ptsz ? (CUstream)0x2 : s;
  trial_ticket tk = {0};
  CUfunction sf = pick(f, params, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, es, &ki, &tk);
  if (__builtin_expect(check_entry != NULL, 0) && sf)
    sf = validate_refuse(ki, "a cooperative launch, which validation does not repeat");
  sample_poll(ki);
  int sampled = sample_begin(ki, es, &tk);
  CUresult r = sf ? real(sf, gx, gy, gz, bx, by, bz, shmem, s, params) : 1;
  if (sf && r != CUDA_SUCCESS) launch_error(f);
  if (r != CUDA_SUCCESS) r = real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
  sample_end(ki, es, sampled, &tk);
  prefetch_hit(f, ki);
  return r;
}
CUresult w_cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                     unsigned shmem, CUstream s, void **params) {
  return coop_with(real_cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shmem, s, params);
}
CUresult w_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                          unsigned bz, unsigned shmem, CUstream s, void **params) {
  return coop_with(real_cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

/* Apps linked against libcuda directly (driver API) reach these through the PLT. */
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shmem, CUstream s, void **params, void **extra) {
  init_driver_calls();
  return w_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  init_driver_calls();
  return w_cuLaunchKernelEx(c, f, p, e);
}
static CUfunction runtime_function(const void *func) {
  void *f = NULL;
  return RUNTIME_REAL(cudaGetFuncBySymbol) && real_cudaGetFuncBySymbol(&f, func) == 0 ? (CUfunction)f : NULL;
}

static cudaError_t runtime_launch(cudaError_t (*real)(const void *, dim3, dim3, void **, size_t, void *),
                                  CUresult (*drv)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                                  unsigned, CUstream, void **, void **),
                                  const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
  init_driver_calls();
  kinfo *ki = NULL;
  CUstream es = !stream && drv == real_cuLaunchKernel_ptsz ? (CUstream)0x2 : stream;
  trial_ticket tk = {0};
  CUfunction sf = drv ? pick(func, args, grid, block, es, &ki, &tk) : NULL;
  int checking = __builtin_expect(check_entry != NULL, 0) && sf;
  if (checking) sf = validate_begin(ki, sf, runtime_function(func), args, grid, block, (unsigned)shmem, stream, drv);
  sample_poll(ki);
  int sampled = sample_begin(ki, es, &tk);
  if (sf) {
    if (drv(sf, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shmem, stream, args, NULL) == CUDA_SUCCESS) {
      sample_end(ki, es, sampled, &tk);
      prefetch_hit(func, ki);
      return 0;
    }
    launch_error(func);
  }
  in_runtime_launch = 1;
  cudaError_t r = real(func, grid, block, args, shmem, stream);
  in_runtime_launch = 0;
  sample_end(ki, es, sampled, &tk);
  if (__builtin_expect(checking, 0)) validate_end();
  prefetch_hit(func, ki);
  return r;
}
EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
  return runtime_launch(RUNTIME_REAL(cudaLaunchKernel), real_cuLaunchKernel, func, grid, block, args, shmem, stream);
}
EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
  return runtime_launch(RUNTIME_REAL(cudaLaunchKernel_ptsz), real_cuLaunchKernel_ptsz, func, grid, block, args, shmem, stream);
}
EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *func, void **args) {
  init_driver_calls();
  kinfo *ki = NULL;
  int sampled = 0, checking = 0;
  trial_ticket tk = {0};
  if (c && c->numAttrs == 0 && real_cuLaunchKernel) { /* with attributes: leave it to the runtime */
    CUfunction sf = pick(func, args, c->gridDim, c->blockDim, c->stream, &ki, &tk);
    checking = __builtin_expect(check_entry != NULL, 0) && sf;
    if (checking)
      sf = validate_begin(ki, sf, runtime_function(func), args, c->gridDim, c->blockDim, (unsigned)c->dynamicSmemBytes, c->stream,
                          real_cuLaunchKernel);
    sample_poll(ki);
    sampled = sample_begin(ki, c->stream, &tk);
    if (sf) {
      if (real_cuLaunchKernel(sf, c->gridDim.x, c->gridDim.y, c->gridDim.z, c->blockDim.x, c->blockDim.y, c->blockDim.z,
                              (unsigned)c->dynamicSmemBytes, c->stream, args, NULL) == CUDA_SUCCESS) {
        sample_end(ki, c->stream, sampled, &tk);
        return 0;
      }
      launch_error(func);
    }
  }
  in_runtime_launch = 1;
  cudaError_t r = RUNTIME_REAL(cudaLaunchKernelExC)(c, func, args);
  in_runtime_launch = 0;
  sample_end(ki, c ? c->stream : NULL, sampled, &tk);
  if (__builtin_expect(checking, 0)) validate_end();
  return r;
}
