/* A warm run's first launches (runtime/warm.py, PROTEUS_PRELOAD=1): the variants the app's last
 * run used, loaded on the prestart thread once their kernel and the app's context are known, so
 * that the first launch of each is a hit instead of a miss on the app's thread (a Python call, a
 * disk read and a module load: 2 ms for adam's one kernel on the H100, inside its timed loop).
 *
 * The thread learns of fat binaries as the app's runtime registers or loads them (a static
 * cudart loads its fat binaries with cuLibraryLoadData once it has a context) and asks
 * runtime.warm_set which launches of those the last run noted; Python answers each as a first
 * launch would be answered (kernel_info, and specialize asking the caches only), before the
 * context exists where it can. Once it does, a kernel whose handle the runtime has not asked for
 * yet is looked up in its library here, with the handle the runtime will be given, and each
 * launch is keyed and its image loaded as a miss would do it, under jit_lock: a launch that
 * comes first misses as before, and a kernel it resolved is left to it. Only images inside a
 * loaded object (dladdr) are read: an app's own buffer passed to cuModuleLoadData may be gone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "hitpath.h"
#include "shim.h"

#define WARM_IMAGES 256

static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t warm_cond = PTHREAD_COND_INITIALIZER;
static const void *warm_images[WARM_IMAGES];   /* warm_lock: fat binaries seen, in order */
static void *warm_owners[WARM_IMAGES];         /* their library (cuLibraryLoadData), else NULL */
static int n_warm_images;
static CUcontext warm_ctx;                     /* the first context the app retained */
static unsigned warm_events, warm_stop, warm_busy;
_Atomic uint64_t n_preloaded;

static void warm_event(void) {
  warm_events++;
  pthread_cond_broadcast(&warm_cond);
}

/* A fat binary registered or loaded by the app's runtime (library: its CUlibrary, or NULL). */
void warm_image(const void *image, void *library) {
  Dl_info info;
  if (!image || !dladdr(image, &info)) return;   /* not static data: it may not outlive the call */
  pthread_mutex_lock(&warm_lock);
  int known = 0;
  for (int i = 0; i < n_warm_images && !known; i++)
    if (warm_images[i] == image) {
      known = 1;
      if (library && !warm_owners[i]) { warm_owners[i] = library; warm_event(); }
    }
  if (!known && n_warm_images < WARM_IMAGES) {
    warm_images[n_warm_images] = image;
    warm_owners[n_warm_images++] = library;
    warm_event();
  }
  pthread_mutex_unlock(&warm_lock);
}

/* The app's runtime retains its context: the noted variants can load. */
CUresult w_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  CUresult r = real_cuDevicePrimaryCtxRetain(ctx, dev);
  if (r == CUDA_SUCCESS && ctx) warm_context(*ctx);
  return r;
}

void warm_context(CUcontext ctx) {
  pthread_mutex_lock(&warm_lock);
  if (!warm_ctx && ctx) { warm_ctx = ctx; warm_event(); }
  pthread_mutex_unlock(&warm_lock);
}

/* At exit, before any handler: the thread stops, and is out of the driver and Python. */
void warm_finish(void) {
  pthread_mutex_lock(&warm_lock);
  warm_stop = 1;
  pthread_cond_broadcast(&warm_cond);
  while (warm_busy) pthread_cond_wait(&warm_cond, &warm_lock);
  pthread_mutex_unlock(&warm_lock);
}

/* fork: the child has no prestart thread; whatever it held is free, and nothing is loaded ahead. */
void warm_atfork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
  warm_lock = fresh;
  warm_cond = fresh_cond;
  warm_busy = 0;
  warm_stop = 1;
}

typedef struct {
  const uint8_t *rec;   /* protocol.WARM_ITEM, then name, known[], args, kernel_info's answer, the image answer */
  uint32_t dims[6], arch, nparams, nname, nargs, ninfo, nanswer;
  int done;
} warm_item;

static void *library_of(const void *image) {
  void *lib = NULL;
  pthread_mutex_lock(&warm_lock);
  for (int i = 0; i < n_warm_images; i++) if (warm_images[i] == image) lib = warm_owners[i];
  pthread_mutex_unlock(&warm_lock);
  return lib;
}

static kinfo *kernel_of(const void *image, const char *name) {
  pthread_mutex_lock(&reg_lock);
  kinfo *found = find_kernel(image, name);
  pthread_mutex_unlock(&reg_lock);
  if (found) return found;
  /* Not asked for by the runtime yet: its library gives the handle the runtime will get. */
  CUlibrary lib = library_of(image);
  CUkernel k;
  if (!lib || !real_cuLibraryGetKernel || real_cuLibraryGetKernel(&k, lib, name) != CUDA_SUCCESS) return NULL;
  remember(k, image, name, OWNER_LIBRARY, lib);
  graph_library_kernel(k);
  return handle_lookup(k);
}

/* Load one noted launch's variant: 1 when there is nothing more to do for it. Python answered
 * for it ahead (runtime.warm_set); here only the driver is asked. jit_lock taken. */
static int preload(warm_item *it, CUcontext ctx, int arch) {
  uint64_t image;
  memcpy(&image, it->rec, 8);
  const uint8_t *p = it->rec + PROTO_WARM_ITEM;
  char *name = strndup((const char *)p, it->nname);
  if (!name) return 1;
  const uint8_t *known = p + it->nname, *args = known + it->nparams, *info = args + it->nargs, *answer = info + it->ninfo;
  kinfo *ki = kernel_of((const void *)(uintptr_t)image, name);
  free(name);
  if (!ki) return 0;   /* its library is not loaded yet */
  pthread_mutex_lock(&jit_lock);
  /* Only a kernel no launch has resolved (the answers are for the kernel id Python gave it
   * ahead), and only on the architecture they were made for (the last run's). */
  if (atomic_load(&ki->state) != K_UNRESOLVED || arch != (int)it->arch) goto out;
  resolve_from(ki, info, it->ninfo);
  if (atomic_load(&ki->state) != K_ACTIVE || ki->nglobals || ki->nparams != it->nparams || ki->nparams > MAX_PARAMS) goto out;
  void *params[MAX_PARAMS];
  size_t off = 0;
  for (uint32_t i = 0; i < ki->nparams; off += ki->sizes[i], i++) {
    if (atomic_load(&ki->fold[i]) && !known[i]) goto out;   /* this run folds what the last did not note */
    params[i] = (void *)(args + off);
  }
  if (off != it->nargs) goto out;
  dim3 grid = {it->dims[0], it->dims[1], it->dims[2]}, block = {it->dims[3], it->dims[4], it->dims[5]};
  uint8_t key[MAX_KEY];
  int len = build_key(ki, params, grid, block, key, atomic_load(&ki->gen));
  CUcontext kctx = ki->ctx_free ? NULL : ctx;
  if (len < 0 || find_variant(ki, kctx, key, len)) goto out;
  answer_meta meta = {0, 0};
  int g = py.GILStateEnsure();   /* (only a refused image calls Python) */
  CUfunction fn = load_answer(ki, answer, it->nanswer, &meta);
  py.GILStateRelease(g);
  if (fn) {
    sentry *ne = new_entry(ki, kctx, key, len, fn, 0);
    if (ne) {
      trial_attach(ki, ne, meta.vid, meta.flags, fn);
      variant_insert(ne);
      atomic_fetch_add(&n_preloaded, 1);
    }
  }
out:
  pthread_mutex_unlock(&jit_lock);
  return 1;
}

/* The prestart thread, once Python is up, until exit. Only with PROTEUS_PRELOAD=1: where the
 * app's first launch follows its context at once (adam: a few small copies), the app missed
 * anyway and its miss ran beside warm_set's Python, each slowing the other (H100: adam's miss
 * 3.7-5.1 ms against 2.3-2.7 without; docs/dev/findings.md). */
void warm_start(void) {
  const char *on = getenv(ENV_PRELOAD);
  if (!on || !(on[0] == '1' || on[0] == 't' || on[0] == 'T' || on[0] == 'y' || on[0] == 'Y')) return;
  uint8_t *blobs[WARM_IMAGES];
  warm_item *items = NULL;
  int nblobs = 0, asked = 0, nitems = 0, left = 0;
  unsigned seen = 0;
  CUcontext current = NULL;
  int arch = 0;
  pthread_mutex_lock(&warm_lock);
  for (;;) {
    while (!warm_stop && seen == warm_events) pthread_cond_wait(&warm_cond, &warm_lock);
    if (warm_stop) break;
    seen = warm_events;
    uint64_t ask[WARM_IMAGES];
    int n = 0;
    for (; asked < n_warm_images; asked++) ask[n++] = (uint64_t)(uintptr_t)warm_images[asked];
    CUcontext ctx = warm_ctx;
    warm_busy = 1;
    pthread_mutex_unlock(&warm_lock);

    if (n && nblobs < WARM_IMAGES) {   /* the last run's launches of these fat binaries */
      ssize_t len = 0;
      int g = py.GILStateEnsure();
      uint8_t *blob = py_bytes(py.CallFunction(f_warm_set, FMT_WARM_SET, (const char *)ask, (ssize_t)(n * PROTO_IMAGE_ADDRESS)), &len);
      py.GILStateRelease(g);
      int kept = 0;
      for (size_t at = 0; blob && at + PROTO_WARM_ITEM <= (size_t)len;) {
        uint32_t h[12];
        memcpy(h, blob + at + 8, sizeof h);
        size_t next = at + PROTO_WARM_ITEM + (size_t)h[7] + h[8] + h[9] + h[10] + h[11];
        warm_item *grown = next <= (size_t)len ? realloc(items, (nitems + 1) * sizeof *items) : NULL;
        if (!grown) break;
        items = grown;
        warm_item *it = &items[nitems++];
        it->rec = blob + at;
        memcpy(it->dims, h, sizeof it->dims);
        it->arch = h[6]; it->nparams = h[7]; it->nname = h[8]; it->nargs = h[9]; it->ninfo = h[10]; it->nanswer = h[11];
        it->done = 0;
        left++; kept++;
        at = next;
      }
      if (kept) blobs[nblobs++] = blob; else free(blob);
    }
    if (ctx && left) {
      if (current != ctx && real_cuCtxSetCurrent && real_cuCtxSetCurrent(ctx) == CUDA_SUCCESS) {
        current = ctx;
        arch = current_arch();
      }
      for (int i = 0; i < nitems && current; i++)
        if (!items[i].done && preload(&items[i], current, arch)) { items[i].done = 1; left--; }
    }
    pthread_mutex_lock(&warm_lock);
    warm_busy = 0;
    pthread_cond_broadcast(&warm_cond);
  }
  pthread_mutex_unlock(&warm_lock);
  for (int i = 0; i < nblobs; i++) free(blobs[i]);
  free(items);
}
