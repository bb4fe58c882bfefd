/* PROTEUS_VALIDATE (CUDA): a variant's check, its first launch run in the shadow of the original
 * (check.c chooses the launch; shim.h says when a variant is checked).
 *
 * Before it, with the whole context idle, every allocation the launch's argument bytes point
 * into (any 8-byte word of an argument that cuMemGetAddressRange knows) and the kernel's
 * device variables are copied aside on the GPU. The variant runs and what it left is copied
 * aside too; the snapshot is restored, and the app's own launch then runs the original kernel
 * (validate_begin answers NULL). After that launch, validate_end compares on the GPU (compare.cu:
 * a kernel that only tells equal from different, so nothing the size of the app's memory crosses
 * to the host when they are equal). Equal, the variant is published and serves every later launch
 * of its key. Different, and where the original CUfunction is known, the original runs a second
 * time on the snapshot, with the app's results kept aside and put back after: a kernel whose own
 * results vary from run to run (atomics, races) cannot be compared, and is reported so rather than
 * denied. That second run only when the first compare differs: a check then costs one extra run
 * of the kernel, not two, and a long kernel is what the check's cost is made of. Still different,
 * the allocations where they differ (the compare answers per allocation) are read back for the run
 * time (runtime/validate.py), which says how they differ and denies the kernel: it then runs the
 * original for good (only those: a difference confined to a few allocations must not bring the
 * whole of the app's memory across, three times). The app always goes on from the
 * original's results, so a checked launch prints what the native run prints.
 *
 * Not a hit-path concern: all of it runs once per variant, and takes a lock, allocates and
 * synchronizes the context on purpose. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compare_ptx.h"
#include "cuda_api.h"
#include "shim.h"

#define MAX_RANGES 256
#define MAX_CONTEXTS 16

static CUresult (*ctx_sync)(void);
static CUresult (*mem_range)(CUdeviceptr *, size_t *, CUdeviceptr);
static CUresult (*mem_alloc)(CUdeviceptr *, size_t);
static CUresult (*mem_free)(CUdeviceptr);
static CUresult (*copy_dtod)(CUdeviceptr, CUdeviceptr, size_t);
static CUresult (*copy_dtoh)(void *, CUdeviceptr, size_t);
static CUresult (*memset_d32)(CUdeviceptr, unsigned, size_t);
static CUresult (*module_load)(CUmodule *, const void *);
static CUresult (*module_function)(CUfunction *, CUmodule, const char *);

typedef struct {
  CUdeviceptr base, snap, after_variant, after_shadow;   /* the app's, its copy, what each kernel left */
  size_t size;
} vrange;
typedef struct {
  kinfo *ki;
  sentry *e;
  int n, shadow;   /* shadow: the original's second run was made (after_shadow holds its results) */
  struct {         /* the launch, for that second run (validate_end runs inside the app's launch call) */
    CUfunction fn;
    void **params;
    dim3 grid, block;
    unsigned shmem;
    CUstream stream;
    launch_fn launch;
  } original;
  vrange r[MAX_RANGES];
  size_t total;
  uint8_t *args;
  size_t nargs;
  uint64_t t0, mark;   /* the check's start; the end of its last phase (check_phase) */
  double ms;
} check;

static __thread check *pending;   /* this thread's check, between its two halves */
static pthread_mutex_t v_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  CUcontext ctx;
  CUfunction fn;   /* NULL: the compare kernel did not load there (the host compares) */
} compare_fns[MAX_CONTEXTS];
static int ncompare;

static int load_calls(void) {
  if (!ctx_sync) {
    *(void **)&mem_range = cuda_sym("cuMemGetAddressRange_v2");
    *(void **)&mem_alloc = cuda_sym("cuMemAlloc_v2");
    *(void **)&mem_free = cuda_sym("cuMemFree_v2");
    *(void **)&copy_dtod = cuda_sym("cuMemcpyDtoD_v2");
    *(void **)&copy_dtoh = cuda_sym("cuMemcpyDtoH_v2");
    *(void **)&memset_d32 = cuda_sym("cuMemsetD32_v2");
    *(void **)&module_load = cuda_sym("cuModuleLoadData");
    *(void **)&module_function = cuda_sym("cuModuleGetFunction");
    *(void **)&ctx_sync = cuda_sym("cuCtxSynchronize");
  }
  return ctx_sync && mem_range && mem_alloc && mem_free && copy_dtod && copy_dtoh;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void free_check(check *c) {
  for (int i = 0; i < c->n; i++) {
    if (c->r[i].snap) mem_free(c->r[i].snap);
    if (c->r[i].after_variant) mem_free(c->r[i].after_variant);
    if (c->r[i].after_shadow) mem_free(c->r[i].after_shadow);
  }
  free(c->args);
  free(c);
}

static uint32_t vid_of(sentry *e) {
  vcheck *v = e ? atomic_load(&e->check) : NULL;
  return v ? v->vid : 0;
}

/* A check that cannot be made: the report says why. In full mode the kernel runs the original
 * for the rest of the run (the promise is native output); by default the variant runs
 * unchecked, as it would without the check (check_done). */
static CUfunction give_up(kinfo *ki, sentry *e, check *c, uint64_t t0, const char *why) {
  uint64_t t = now_ns();
  if (c) free_check(c);
  check_phase(CHECK_FREE, &t);
  if (g_validate == VALIDATE_FULL) atomic_store(&ki->state, K_DISABLED);
  py_validate_skipped(ki->kid, vid_of(e), why);
  check_phase(CHECK_PYTHON, &t);
  if (e) check_done(e, CHECKED_UNCHECKABLE, now_ns() - t0);
  return NULL;
}

/* Default mode: a kernel whose original's own results varied at a check needs no check of its
 * other variants, which can only end the same way. The run time has just marked it for later
 * runs (runtime/validate.py); asked again, it says so, and that replaces what validate_begin
 * cached as the kernel's refusal ("", none). A malloc'd "" is left to leak: another thread may
 * be reading it. */
static void mark_varies(kinfo *ki) {
  if (g_validate != VALIDATE_ONCE) return;
  char *why = py_validate_refusal(ki->kid);
  if (!why || !*why) {
    free(why);
    return;
  }
  char *cur = atomic_load(&ki->check_refusal);
  while ((!cur || !*cur) && !atomic_compare_exchange_weak(&ki->check_refusal, &cur, why)) {}
  if (cur && *cur) free(why);   /* it had a refusal of its own */
}

static int add_range(check *c, CUdeviceptr p) {
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!p || mem_range(&base, &size, p) != CUDA_SUCCESS || !size) return 0;
  for (int i = 0; i < c->n; i++)
    if (c->r[i].base == base) return 0;
  if (c->n == MAX_RANGES) return -1;
  c->r[c->n++] = (vrange){base, 0, 0, 0, size};
  c->total += size;
  return 0;
}

static size_t max_bytes(void) {
  const char *m = getenv(ENV_VALIDATE_MAX_MB);
  long mb = m && *m ? atol(m) : 2048;
  return (size_t)(mb > 0 ? mb : 2048) << 20;
}

CUfunction validate_refuse(kinfo *ki, const char *why) {
  sentry *e = check_entry;
  check_entry = NULL;
  if (!ki || !e) return NULL;
  return give_up(ki, e, NULL, now_ns(), why);
}

/* Run `fn` on the memory as the snapshot has it; NULL, or why not. */
static const char *run_kernel(CUfunction fn, void **params, dim3 grid, dim3 block, unsigned shmem, CUstream stream,
                              launch_fn launch, const char *who) {
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
  return NULL;
}

/* The variant on the snapshot's memory; what it left goes aside, and the snapshot back. */
static const char *variant_run(check *c, CUfunction fn, void **params, dim3 grid, dim3 block, unsigned shmem, CUstream stream,
                               launch_fn launch) {
  const char *why = run_kernel(fn, params, grid, block, shmem, stream, launch, "variant");
  if (why) return why;
  for (int i = 0; i < c->n; i++)
    if (copy_dtod(c->r[i].after_variant, c->r[i].base, c->r[i].size) != CUDA_SUCCESS ||
        copy_dtod(c->r[i].base, c->r[i].snap, c->r[i].size) != CUDA_SUCCESS)
      return "keeping the results aside failed";
  return ctx_sync() == CUDA_SUCCESS ? NULL : "restoring the snapshot failed";
}

/* After the app's launch: the original once more on the snapshot, the app's results kept aside
 * and put back. Its results end in after_shadow (the snapshot's buffer, no longer needed, holds
 * them on the way). NULL, or why not. */
static const char *original_rerun(check *c) {
  for (int i = 0; i < c->n; i++)
    if (!c->r[i].after_shadow && mem_alloc(&c->r[i].after_shadow, c->r[i].size) != CUDA_SUCCESS)
      return "no device memory for the original's second run";
  for (int i = 0; i < c->n; i++)
    if (copy_dtod(c->r[i].after_shadow, c->r[i].base, c->r[i].size) != CUDA_SUCCESS)
      return "keeping the app's results aside failed";
  const char *why = NULL;
  for (int i = 0; !why && i < c->n; i++)
    if (copy_dtod(c->r[i].base, c->r[i].snap, c->r[i].size) != CUDA_SUCCESS) why = "restoring the snapshot failed";
  if (!why)
    why = run_kernel(c->original.fn, c->original.params, c->original.grid, c->original.block, c->original.shmem,
                     c->original.stream, c->original.launch, "original kernel");
  if (why) {   /* the app goes on from its own results whatever happened here */
    for (int i = 0; i < c->n; i++) copy_dtod(c->r[i].base, c->r[i].after_shadow, c->r[i].size);
    ctx_sync();
    return why;
  }
  for (int i = 0; i < c->n; i++) {
    if (copy_dtod(c->r[i].snap, c->r[i].base, c->r[i].size) != CUDA_SUCCESS ||
        copy_dtod(c->r[i].base, c->r[i].after_shadow, c->r[i].size) != CUDA_SUCCESS)
      return "putting the app's results back failed";
    CUdeviceptr rerun = c->r[i].snap;
    c->r[i].snap = c->r[i].after_shadow;
    c->r[i].after_shadow = rerun;
  }
  c->shadow = 1;
  return ctx_sync() == CUDA_SUCCESS ? NULL : "putting the app's results back failed";
}

static CUfunction check_variant(kinfo *ki, sentry *e, CUfunction variant, CUfunction original, void **params, dim3 grid,
                                dim3 block, unsigned shmem, CUstream stream, launch_fn launch, uint64_t t0);

CUfunction validate_begin(kinfo *ki, CUfunction variant, CUfunction original, void **params, dim3 grid, dim3 block,
                          unsigned shmem, CUstream stream, launch_fn launch) {
  sentry *e = check_entry;
  check_entry = NULL;
  vcheck *v = e ? atomic_load(&e->check) : NULL;
  if (!ki || !v || v->fn != variant) return variant;   /* not the launch check_pick chose */
  uint64_t t0 = now_ns();
  if (atomic_load(&ki->state) != K_ACTIVE) {
    check_done(e, CHECKED_DIFFERS, 0);   /* denied meanwhile: it never serves */
    return NULL;
  }
  /* a context synchronization would end an open stream capture; one check per thread at a time */
  if (atomic_load_explicit(&captures_open, memory_order_relaxed) || pending) {
    check_done(e, CHECKED_LATER, 0);
    return NULL;
  }
  if (!load_calls()) return give_up(ki, e, NULL, t0, "the driver lacks a call validation needs");
  uint64_t t = t0;
  char *refused = atomic_load(&ki->check_refusal);   /* why its variants must not run in the shadow */
  if (!refused) {
    char *asked = py_validate_refusal(ki->kid), *none = NULL;
    if (!asked) asked = "";
    if (!atomic_compare_exchange_strong(&ki->check_refusal, &none, asked)) {   /* another thread asked too */
      if (*asked) free(asked);
      asked = none;
    }
    refused = asked;
  }
  check_phase(CHECK_PYTHON, &t);
  if (*refused) {
    give_up(ki, e, NULL, t0, refused);
    return NULL;
  }
  prof_push("proteus-rewrite validation: %s", ki->name ? ki->name : "?");
  CUfunction fn = check_variant(ki, e, variant, original, params, grid, block, shmem, stream, launch, t0);
  prof_pop();
  return fn;
}

static int alloc_copy(CUdeviceptr *p, size_t size) { return mem_alloc(p, size) == CUDA_SUCCESS; }

/* The check proper: both kernels run on a snapshot of the memory the launch reaches, and what
 * they left is kept on the GPU for validate_end. */
static CUfunction check_variant(kinfo *ki, sentry *e, CUfunction variant, CUfunction original, void **params, dim3 grid,
                                dim3 block, unsigned shmem, CUstream stream, launch_fn launch, uint64_t t0) {
  double m0 = now_ms();
  check *c = calloc(1, sizeof *c);
  if (!c) return give_up(ki, e, NULL, t0, "out of host memory");
  c->ki = ki;
  c->e = e;
  c->t0 = t0;
  c->mark = now_ns();
  c->original.fn = original;
  c->original.params = params;
  c->original.grid = grid;
  c->original.block = block;
  c->original.shmem = shmem;
  c->original.stream = stream;
  c->original.launch = launch;
  if (ctx_sync() != CUDA_SUCCESS) return give_up(ki, e, c, t0, "the context was in an error state before the launch");
  for (uint32_t i = 0; i < ki->nparams; i++)
    for (uint32_t off = 0; params && off + 8 <= ki->sizes[i]; off += 8) {
      CUdeviceptr p;
      memcpy(&p, (const uint8_t *)params[i] + off, 8);
      if (add_range(c, p) < 0) return give_up(ki, e, c, t0, "its arguments point into more allocations than validation copies");
    }
  for (uint32_t i = 0; i < ki->nglobals; i++)
    if (add_range(c, cuda_global_address(ki, NULL, ki->globals[i])) < 0)
      return give_up(ki, e, c, t0, "its arguments point into more allocations than validation copies");
  if (c->total > max_bytes()) {
    char why[160];
    snprintf(why, sizeof why, "its allocations hold %zu MB, more than PROTEUS_VALIDATE_MAX_MB (%zu)", c->total >> 20,
             max_bytes() >> 20);
    return give_up(ki, e, c, t0, why);
  }
  c->nargs = pack_args(ki, params, NULL);
  c->args = malloc(c->nargs ? c->nargs : 1);
  if (!c->args) return give_up(ki, e, c, t0, "out of host memory");
  if (params) pack_args(ki, params, c->args);
  for (int i = 0; i < c->n; i++)
    if (!alloc_copy(&c->r[i].snap, c->r[i].size) || !alloc_copy(&c->r[i].after_variant, c->r[i].size) ||
        copy_dtod(c->r[i].snap, c->r[i].base, c->r[i].size) != CUDA_SUCCESS)
      return give_up(ki, e, c, t0, "no device memory for the snapshot");
  if (ctx_sync() != CUDA_SUCCESS) return give_up(ki, e, c, t0, "the snapshot failed");
  check_phase(CHECK_PREPARE, &c->mark);
  const char *why = variant_run(c, variant, params, grid, block, shmem, stream, launch);
  if (why) return give_up(ki, e, c, t0, why);
  check_phase(CHECK_SHADOW, &c->mark);
  c->ms = now_ms() - m0;
  pending = c;
  return NULL;   /* the app's launch runs the original, on the memory as it was */
}

/* The compare kernel in the current context, loaded once per context; NULL where it cannot be
 * (the host compares instead). */
static CUfunction compare_fn(void) {
  CUcontext ctx = NULL;
  if (!module_load || !module_function || !memset_d32 || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return NULL;
  CUfunction fn = NULL;
  pthread_mutex_lock(&v_lock);
  int i = 0;
  while (i < ncompare && compare_fns[i].ctx != ctx) i++;
  if (i < ncompare) {
    fn = compare_fns[i].fn;
  } else {
    CUmodule m = NULL;
    if (module_load(&m, compare_ptx) != CUDA_SUCCESS || module_function(&fn, m, "proteus_differs") != CUDA_SUCCESS) fn = NULL;
    if (ncompare < MAX_CONTEXTS) compare_fns[ncompare++] = (__typeof__(compare_fns[0])){ctx, fn};
  }
  pthread_mutex_unlock(&v_lock);
  return fn;
}

/* On the GPU, range by range: do the variant's results (differs[i]) or the shadow run's
 * (*shadow_differs, any range) differ from what the app's launch of the original left? A pair
 * of flags per range, so that only the ranges that differ are read back. 1 answered, 0 could
 * not tell. */
static int gpu_compare(check *c, uint8_t *differs, int *shadow_differs) {
  CUfunction fn = compare_fn();
  CUdeviceptr flags = 0;
  unsigned out[2 * MAX_RANGES];
  size_t pairs = c->n ? (size_t)c->n : 1;   /* (a launch that reaches no memory: nothing differs) */
  if (!fn || mem_alloc(&flags, 8 * pairs) != CUDA_SUCCESS) return 0;
  int ok = memset_d32(flags, 0, 2 * pairs) == CUDA_SUCCESS;
  for (int i = 0; ok && i < c->n; i++) {
    unsigned long long words = c->r[i].size / 8;
    unsigned tail = (unsigned)(c->r[i].size % 8);
    CUdeviceptr a = c->r[i].after_variant, b = c->r[i].base, s = c->r[i].after_shadow, f = flags + 8 * (CUdeviceptr)i;
    CUdeviceptr ta = a + words * 8, tb = b + words * 8, ts = s ? s + words * 8 : 0;
    void *args[] = {&a, &b, &s, &words, &ta, &tb, &ts, &tail, &f};
    unsigned blocks = (unsigned)((words + 255) / 256);
    blocks = blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks;
    ok = real_cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, NULL, args, NULL) == CUDA_SUCCESS;
  }
  ok = ok && ctx_sync() == CUDA_SUCCESS && copy_dtoh(out, flags, 8 * pairs) == CUDA_SUCCESS;
  mem_free(flags);
  *shadow_differs = 0;
  for (int i = 0; ok && i < c->n; i++) {
    differs[i] = out[2 * i] != 0;
    *shadow_differs |= out[2 * i + 1] != 0;
  }
  return ok;
}

/* The bytes of one side's ranges marked in `read`, back to back, on the host (NULL: failed). */
static uint8_t *read_back(check *c, int side, const uint8_t *read, size_t total) {
  uint8_t *buf = malloc(total ? total : 1);
  size_t off = 0;
  for (int i = 0; buf && i < c->n; i++) {
    if (!read[i]) continue;
    CUdeviceptr from = side == 0 ? c->r[i].base : side == 1 ? c->r[i].after_variant : c->r[i].after_shadow;
    if (copy_dtoh(buf + off, from, c->r[i].size) != CUDA_SUCCESS) {
      free(buf);
      buf = NULL;
    }
    off += c->r[i].size;
  }
  return buf;
}

void validate_end(void) {
  check *c = pending;
  if (!c) return;
  pending = NULL;
  kinfo *ki = c->ki;
  sentry *e = c->e;
  uint32_t vid = vid_of(e);
  double m0 = now_ms();
  if (ctx_sync() != CUDA_SUCCESS) {
    give_up(ki, e, c, c->t0, "the original kernel's launch failed");
    return;
  }
  check_phase(CHECK_APP, &c->mark);
  uint8_t read[MAX_RANGES];
  int varies = 0, differs = 0;
  int told = gpu_compare(c, read, &varies);
  check_phase(CHECK_COMPARE, &c->mark);
  for (int i = 0; i < c->n; i++) {
    if (!told) read[i] = 1;   /* not compared on the GPU: the run time compares it all */
    differs |= read[i];
  }
  if (differs && c->original.fn) {   /* is it the variant, or does the original differ from itself? */
    const char *why = original_rerun(c);
    check_phase(CHECK_SHADOW, &c->mark);
    if (why) {
      give_up(ki, e, c, c->t0, why);
      return;
    }
    if (told) told = gpu_compare(c, read, &varies);
    check_phase(CHECK_COMPARE, &c->mark);
    for (int i = 0; !told && i < c->n; i++) read[i] = 1;
  }
  if (told && (!differs || varies)) {
    /* equal; or the original's own two runs disagree, and there is nothing to hold the variant to */
    py_checked(ki->kid, vid, varies ? "varies" : "same", c->args, c->nargs, c->n, c->total, c->ms + (now_ms() - m0));
    if (varies) mark_varies(ki);
    check_phase(CHECK_PYTHON, &c->mark);
    if (varies && g_validate == VALIDATE_FULL) atomic_store(&ki->state, K_DISABLED);
    uint64_t t = c->mark, t0 = c->t0;
    free_check(c);
    check_phase(CHECK_FREE, &t);
    check_done(e, varies ? CHECKED_UNCHECKABLE : CHECKED_SAME, now_ns() - t0);
    return;
  }
  /* different, or not comparable on the GPU: the run time compares the bytes of the ranges that
   * differ (all, where the GPU could not tell) and says how. The shadow run's bytes go along
   * only where the GPU could not tell: otherwise it matched the original's everywhere. */
  uint8_t *ranges = malloc((size_t)c->n * PROTO_VALIDATE_RANGE + 1);
  size_t total = 0;
  for (int i = 0; ranges && i < c->n; i++) {
    uint64_t desc[3] = {c->r[i].base, c->r[i].size, read[i]};
    memcpy(ranges + (size_t)i * PROTO_VALIDATE_RANGE, desc, PROTO_VALIDATE_RANGE);
    total += read[i] ? c->r[i].size : 0;
  }
  int send_shadow = c->shadow && !told;
  uint8_t *original = read_back(c, 0, read, total), *variant = read_back(c, 1, read, total);
  uint8_t *shadow = send_shadow ? read_back(c, 2, read, total) : NULL;
  if (!ranges || !original || !variant || (send_shadow && !shadow)) {
    free(ranges);
    free(original);
    free(variant);
    free(shadow);
    give_up(ki, e, c, c->t0, "reading back the results failed");
    return;
  }
  check_phase(CHECK_READBACK, &c->mark);
  int verdict = py_validated(ki->kid, vid, c->args, c->nargs, ranges, (size_t)c->n * PROTO_VALIDATE_RANGE, variant, original,
                             shadow, total, c->ms + (now_ms() - m0));
  if (verdict == 2) mark_varies(ki);
  check_phase(CHECK_PYTHON, &c->mark);
  if (verdict == 1 || (verdict == 2 && g_validate == VALIDATE_FULL)) atomic_store(&ki->state, K_DISABLED);
  uint64_t t = c->mark, t0 = c->t0;
  free(ranges);
  free(original);
  free(variant);
  free(shadow);
  free_check(c);
  check_phase(CHECK_FREE, &t);
  check_done(e, verdict == 0 ? CHECKED_SAME : verdict == 2 ? CHECKED_UNCHECKABLE : CHECKED_DIFFERS, now_ns() - t0);
}
