/* PROTEUS_VALIDATE (CUDA): a variant's first launch runs in the shadow of the original.
 *
 * Before it, with the whole context idle, every allocation the launch's argument bytes point
 * into (any 8-byte word of an argument that cuMemGetAddressRange knows) and the kernel's
 * device variables are copied aside. The variant runs, what it left in those allocations is
 * read back, the copies are restored, and the app's own launch then runs the original kernel
 * (validate_begin answers NULL). After that launch, validate_end reads the original's results
 * and hands both to the run time (runtime/validate.py), which denies the kernel if they differ:
 * it then runs the original for good. Where the original CUfunction is known, it also runs once
 * in the shadow: a kernel whose own results vary from run to run (atomics, races) cannot be
 * compared, and is reported so rather than denied. The app always goes on from the original's results, so
 * a run under validation prints what the native run prints.
 *
 * Not a hit-path concern: all of it runs only with PROTEUS_VALIDATE set, once per variant, and
 * takes a lock, allocates and synchronizes the context on purpose. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "shim.h"

#define MAX_RANGES 256
#define MAX_CHECKED 4096

static CUresult (*ctx_sync)(void);
static CUresult (*mem_range)(CUdeviceptr *, size_t *, CUdeviceptr);
static CUresult (*mem_alloc)(CUdeviceptr *, size_t);
static CUresult (*mem_free)(CUdeviceptr);
static CUresult (*copy_dtod)(CUdeviceptr, CUdeviceptr, size_t);
static CUresult (*copy_dtoh)(void *, CUdeviceptr, size_t);

typedef struct {
  CUdeviceptr base, snap;
  size_t size;
} vrange;
typedef struct {
  kinfo *ki;
  CUfunction variant;
  int n;
  vrange r[MAX_RANGES];
  uint8_t *after_variant;   /* what the variant left, range after range */
  uint8_t *after_shadow;    /* what the original left in the shadow run (NULL: not run) */
  size_t total;
  uint8_t *args;
  size_t nargs;
  double ms;
} check;

static __thread check *pending;   /* this thread's check, between its two halves */
static pthread_mutex_t v_lock = PTHREAD_MUTEX_INITIALIZER;
/* variants checked (done 1) or being checked (done 0) */
static struct {
  CUfunction fn;
  int done;
} checked[MAX_CHECKED];
static int nchecked;

static void mark_done(CUfunction fn) {
  pthread_mutex_lock(&v_lock);
  for (int i = 0; i < nchecked; i++)
    if (checked[i].fn == fn) checked[i].done = 1;
  pthread_mutex_unlock(&v_lock);
}

static int load_calls(void) {
  if (!ctx_sync) {
    *(void **)&mem_range = cuda_sym("cuMemGetAddressRange_v2");
    *(void **)&mem_alloc = cuda_sym("cuMemAlloc_v2");
    *(void **)&mem_free = cuda_sym("cuMemFree_v2");
    *(void **)&copy_dtod = cuda_sym("cuMemcpyDtoD_v2");
    *(void **)&copy_dtoh = cuda_sym("cuMemcpyDtoH_v2");
    *(void **)&ctx_sync = cuda_sym("cuCtxSynchronize");
  }
  return ctx_sync && mem_range && mem_alloc && mem_free && copy_dtod && copy_dtoh;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The kernel runs the original from now on: this run's deny (the run time keeps the lasting one). */
static void deny(kinfo *ki) { atomic_store(&ki->state, K_DISABLED); }


static void free_check(check *c) {
  for (int i = 0; i < c->n; i++)
    if (c->r[i].snap) mem_free(c->r[i].snap);
  free(c->after_variant);
  free(c->after_shadow);
  free(c->args);
  free(c);
}

/* A check that cannot be made: the kernel runs the original for the rest of the run (the
 * promise is native output), and the report says why. */
static CUfunction give_up(kinfo *ki, check *c, const char *why) {
  if (c) free_check(c);
  deny(ki);
  py_validate_skipped(ki->kid, why);
  return NULL;
}

static int add_range(check *c, CUdeviceptr p) {
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!p || mem_range(&base, &size, p) != CUDA_SUCCESS || !size) return 0;
  for (int i = 0; i < c->n; i++)
    if (c->r[i].base == base) return 0;
  if (c->n == MAX_RANGES) return -1;
  c->r[c->n++] = (vrange){base, 0, size};
  c->total += size;
  return 0;
}

static size_t max_bytes(void) {
  const char *m = getenv(ENV_VALIDATE_MAX_MB);
  long mb = m && *m ? atol(m) : 2048;
  return (size_t)(mb > 0 ? mb : 2048) << 20;
}

CUfunction validate_refuse(kinfo *ki, const char *why) {
  if (!ki || atomic_load(&ki->state) != K_ACTIVE) return NULL;
  return give_up(ki, NULL, why);
}

/* Run `fn` on the snapshot's memory and read back what it left into `into`; then restore the
 * snapshot. NULL, or why not. */
static const char *shadow_run(check *c, CUfunction fn, void **params, dim3 grid, dim3 block, unsigned shmem, CUstream stream,
                              launch_fn launch, uint8_t *into, const char *who) {
  static __thread char why[128];
  CUresult r = launch(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, shmem, stream, params, NULL);
  if (r != CUDA_SUCCESS) {
    snprintf(why, sizeof why, "the %s did not launch (CUDA error %d)", who, (int)r);
    return why;
  }
  if ((r = ctx_sync()) != CUDA_SUCCESS) {   /* a fault is sticky: nothing after it runs in this context */
    snprintf(why, sizeof why, "the %s failed on the GPU (CUDA error %d)", who, (int)r);
    return why;
  }
  size_t off = 0;
  for (int i = 0; i < c->n; off += c->r[i].size, i++)
    if (copy_dtoh(into + off, c->r[i].base, c->r[i].size) != CUDA_SUCCESS ||
        copy_dtod(c->r[i].base, c->r[i].snap, c->r[i].size) != CUDA_SUCCESS)
      return "reading back the results failed";
  return ctx_sync() == CUDA_SUCCESS ? NULL : "restoring the snapshot failed";
}

static CUfunction check_variant(kinfo *ki, CUfunction variant, CUfunction original, void **params, dim3 grid, dim3 block,
                                unsigned shmem, CUstream stream, launch_fn launch);

CUfunction validate_begin(kinfo *ki, CUfunction variant, CUfunction original, void **params, dim3 grid, dim3 block,
                          unsigned shmem, CUstream stream, launch_fn launch) {
  if (!ki || !variant) return variant;
  if (atomic_load(&ki->state) == K_DISABLED) return NULL;
  /* a context synchronization would end an open stream capture: check later */
  if (atomic_load_explicit(&captures_open, memory_order_relaxed) || pending) return NULL;
  pthread_mutex_lock(&v_lock);
  int seen = -1;
  for (int i = 0; i < nchecked && seen < 0; i++)
    if (checked[i].fn == variant) seen = checked[i].done;
  int full = seen < 0 && nchecked == MAX_CHECKED;
  if (seen < 0 && !full) checked[nchecked++].fn = variant;
  pthread_mutex_unlock(&v_lock);
  /* checked and kept: the variant; being checked on another thread: the original, until then */
  if (seen >= 0) return seen && atomic_load(&ki->state) == K_ACTIVE ? variant : NULL;
  if (full) return give_up(ki, NULL, "more variants than validation tracks");
  if (!load_calls()) return give_up(ki, NULL, "the driver lacks a call validation needs");
  char *refused = py_validate_refusal(ki->kid);   /* why its variants must not run in the shadow */
  if (refused) {
    give_up(ki, NULL, refused);
    free(refused);
    return NULL;
  }
  prof_push("proteus-rewrite validation: %s", ki->name ? ki->name : "?");
  CUfunction fn = check_variant(ki, variant, original, params, grid, block, shmem, stream, launch);
  prof_pop();
  return fn;
}

/* The check proper: both kernels run on a snapshot of the memory the launch reaches, and their
 * results are kept for validate_end to compare. */
static CUfunction check_variant(kinfo *ki, CUfunction variant, CUfunction original, void **params, dim3 grid, dim3 block,
                                unsigned shmem, CUstream stream, launch_fn launch) {
  double t0 = now_ms();
  check *c = calloc(1, sizeof *c);
  if (!c) return give_up(ki, NULL, "out of host memory");
  c->ki = ki;
  c->variant = variant;
  if (ctx_sync() != CUDA_SUCCESS) return give_up(ki, c, "the context was in an error state before the launch");
  for (uint32_t i = 0; i < ki->nparams; i++)
    for (uint32_t off = 0; params && off + 8 <= ki->sizes[i]; off += 8) {
      CUdeviceptr p;
      memcpy(&p, (const uint8_t *)params[i] + off, 8);
      if (add_range(c, p) < 0) return give_up(ki, c, "its arguments point into more allocations than validation copies");
    }
  for (uint32_t i = 0; i < ki->nglobals; i++)
    if (add_range(c, cuda_global_address(ki, NULL, ki->globals[i])) < 0)
      return give_up(ki, c, "its arguments point into more allocations than validation copies");
  if (c->total > max_bytes()) {
    char why[160];
    snprintf(why, sizeof why, "its allocations hold %zu MB, more than PROTEUS_VALIDATE_MAX_MB (%zu)", c->total >> 20,
             max_bytes() >> 20);
    return give_up(ki, c, why);
  }
  c->nargs = pack_args(ki, params, NULL);
  c->args = malloc(c->nargs ? c->nargs : 1);
  c->after_variant = malloc(c->total ? c->total : 1);
  if (original) c->after_shadow = malloc(c->total ? c->total : 1);
  if (!c->args || !c->after_variant || (original && !c->after_shadow)) return give_up(ki, c, "out of host memory");
  if (params) pack_args(ki, params, c->args);
  for (int i = 0; i < c->n; i++)
    if (mem_alloc(&c->r[i].snap, c->r[i].size) != CUDA_SUCCESS ||
        copy_dtod(c->r[i].snap, c->r[i].base, c->r[i].size) != CUDA_SUCCESS)
      return give_up(ki, c, "no device memory for the snapshot");
  if (ctx_sync() != CUDA_SUCCESS) return give_up(ki, c, "the snapshot failed");
  const char *why = shadow_run(c, variant, params, grid, block, shmem, stream, launch, c->after_variant, "variant");
  if (!why && original)
    why = shadow_run(c, original, params, grid, block, shmem, stream, launch, c->after_shadow, "original kernel");
  if (why) return give_up(ki, c, why);
  c->ms = now_ms() - t0;
  pending = c;
  return NULL;   /* the app's launch runs the original, on the memory as it was */
}

void validate_end(void) {
  check *c = pending;
  if (!c) return;
  pending = NULL;
  kinfo *ki = c->ki;
  double t0 = now_ms();
  uint8_t *after_original = malloc(c->total ? c->total : 1);
  uint8_t *ranges = malloc((size_t)c->n * PROTO_VALIDATE_RANGE + 1);
  int ok = after_original && ranges && ctx_sync() == CUDA_SUCCESS;
  size_t off = 0;
  for (int i = 0; ok && i < c->n; off += c->r[i].size, i++) {
    uint64_t desc[2] = {c->r[i].base, c->r[i].size};
    memcpy(ranges + (size_t)i * PROTO_VALIDATE_RANGE, desc, PROTO_VALIDATE_RANGE);
    ok = copy_dtoh(after_original + off, c->r[i].base, c->r[i].size) == CUDA_SUCCESS;
  }
  if (!ok) {
    free(after_original);
    free(ranges);
    give_up(ki, c, "reading back the original's results failed");
    return;
  }
  int differ = py_validated(ki->kid, c->args, c->nargs, ranges, (size_t)c->n * PROTO_VALIDATE_RANGE, c->after_variant,
                            after_original, c->after_shadow, c->total, c->ms + (now_ms() - t0));
  if (differ) deny(ki);
  else mark_done(c->variant);
  free(after_original);
  free(ranges);
  free_check(c);
}
