/* The bottom layer, shared by every thread and both platforms: the tables (launch handles ->
 * kernels, loaded images, and the variants: lock-free open addressing, entries never freed, so a
 * reader never sees one go), the counters the report reads, and what every layer uses (clocks,
 * warnings, glibc's own dlsym, the chosen platform). It calls nothing above it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "platform.h"
#include "shim.h"
#include "tables.h"

hslot handles[HSLOTS];
/* The module (or library) each slot's handle came from, read on misses only. The kernel's own
 * `owner` is the first one; a context that loads the same image again has its module, and its
 * device variables, of its own. */
_Atomic(void *) handle_owners[HSLOTS];
_Atomic(sentry *) variants[SSLOTS];
pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;   /* registration and inserts */
pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;   /* one compilation at a time */
kinfo *all_kernels;
static _Atomic uint64_t n_variants;
_Atomic uint64_t unknown_launches;   /* launches of handles never registered with us */
_Atomic uint64_t t_python_ns, t_miss_ns, n_misses, t_prepare_ns, t_exit_wait_ns, t_await_ns, n_awaits;
_Atomic uint64_t t_check_ns, n_checks;   /* await_variant's checks that did not wait */
_Atomic uint64_t n_deferred;   /* misses handed to the value tracker later (defer) */
_Atomic uint64_t n_preloaded;
_Atomic int captures_open;
int g_trace_launch;

/* Where the CPU went (the report's threads_ms): the app's main() (wall and its thread's CPU,
 * where the shim wraps main), and the CPU of the shim's own threads. A cold run that is slower
 * than a warm one with no more counted waits shows here whether the app's thread did more work
 * (contention for its core) or waited outside the shim. */
_Atomic uint64_t t_loaded_ns, t_main_start_ns, t_main_end_ns, t_main_cpu_ns, t_worker_cpu_ns, t_prestart_cpu_ns;
uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

_Atomic uint64_t t_stage_ns[MISS_STAGES];
void stage(int which, uint64_t *t) {
  uint64_t now = now_ns();
  atomic_fetch_add_explicit(&t_stage_ns[which], now - *t, memory_order_relaxed);
  *t = now;
}

uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "proteus: warning: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

void *(*real_dlsym)(void *, const char *);

EARLY void init_real_dlsym(void) {
  if (real_dlsym) return;
  /* dlsym itself is interposed: reach glibc's through its versioned name. */
  static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
  for (int i = 0; versions[i] && !real_dlsym; i++)
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

/* ------------------------------------------------------------------ the platform */

const struct gpu_ops *_Atomic gpu;
static _Atomic(const struct gpu_ops *) claimed;

/* The first platform entry point the app calls decides (platform.h); every later claim of the
 * same platform is a load and a compare. A thread that claims what another is claiming at the
 * same instant waits until that one has published the table, so neither goes on with the
 * default's. */
int gpu_claim(const struct gpu_ops *ops) {
  const struct gpu_ops *owner = atomic_load_explicit(&claimed, memory_order_acquire);
  if (!owner && atomic_compare_exchange_strong(&claimed, &owner, ops)) {
    gpu = ops;
    return 1;
  }
  if (owner != ops) return 0;
  while (gpu != ops) sched_yield();
  return 1;
}

void gpu_default(const struct gpu_ops *ops) {
  const struct gpu_ops *none = NULL;
  atomic_compare_exchange_strong(&gpu, &none, ops);
}

kinfo *handle_lookup(const void *h) {
  hslot *e = find_handle(h);
  return e ? atomic_load_explicit(&e->ki, memory_order_acquire) : NULL;
}

/* The module or library a launch handle came from (NULL: unknown). Lock-free. */
void *handle_owner(const void *h) {
  hslot *e = find_handle(h);
  return e ? atomic_load_explicit(&handle_owners[e - handles], memory_order_acquire) : NULL;
}

void handle_insert(const void *h, kinfo *ki, void *owner) {   /* caller holds reg_lock */
  uint32_t i = (uint32_t)mix64((uint64_t)(uintptr_t)h) & (HSLOTS - 1);
  for (uint32_t n = 0; n < HSLOTS; n++, i = (i + 1) & (HSLOTS - 1)) {
    const void *k = atomic_load_explicit(&handles[i].handle, memory_order_relaxed);
    if (k && k != h) continue;
    atomic_store_explicit(&handle_owners[i], owner, memory_order_release);
    atomic_store_explicit(&handles[i].ki, ki, memory_order_release);
    if (!k) atomic_store_explicit(&handles[i].handle, h, memory_order_release);
    return;
  }
}

kinfo *find_kernel(const void *image, const char *name) {   /* reg_lock held */
  for (kinfo *k = all_kernels; k; k = k->next_all)
    if (k->image == image && strcmp(k->name, name) == 0) return k;
  return NULL;
}

/* Remember that `handle` launches kernel `name` of `image`. */
void remember(const void *handle, const void *image, const char *name, int owner_kind, void *owner) {
  if (!handle || !image || !name) return;
  pthread_mutex_lock(&reg_lock);
  kinfo *ki = find_kernel(image, name);
  if (!ki) {
    ki = aligned_alloc(_Alignof(kinfo), sizeof *ki);
    if (ki) {
      memset(ki, 0, sizeof *ki);
      ki->image = image;
      ki->name = strdup(name);
      ki->owner_kind = owner_kind;
      ki->owner = owner;
      ki->next_all = all_kernels;
      all_kernels = ki;
    }
  }
  if (ki) handle_insert(handle, ki, owner);
  pthread_mutex_unlock(&reg_lock);
}

/* Loaded images (modules/libraries -> the bytes they were loaded from). */
typedef struct image_reg {
  struct image_reg *next;
  void *owner;
  const void *image;
} image_reg;
static image_reg *images;

void remember_image(void *owner, const void *image) {
  pthread_mutex_lock(&reg_lock);
  image_reg *r = malloc(sizeof *r);
  if (r) {
    r->owner = owner;
    r->image = image;
    r->next = images;
    images = r;
  }
  pthread_mutex_unlock(&reg_lock);
}

const void *image_of(void *owner) {
  const void *found = NULL;
  pthread_mutex_lock(&reg_lock);
  for (image_reg *r = images; r; r = r->next)
    if (r->owner == owner) {
      found = r->image;
      break;
    }
  pthread_mutex_unlock(&reg_lock);
  return found;
}

sentry *variant_lookup(uint64_t h, kinfo *ki, gpu_ctx ctx, const uint8_t *key, uint32_t len) {
  uint32_t i = (uint32_t)h & (SSLOTS - 1);
  for (uint32_t n = 0; n < SSLOTS; n++, i = (i + 1) & (SSLOTS - 1)) {
    sentry *e = atomic_load_explicit(&variants[i], memory_order_acquire);
    if (!e) return NULL;
    if (e->hash == h && e->ki == ki && e->ctx == ctx && e->keylen == len && !memcmp(e->key, key, len)) return e;
  }
  return NULL;
}

void variant_insert(sentry *ne) {   /* caller holds jit_lock */
  if (atomic_load(&n_variants) >= SSLOTS / 2) return;   /* keep probes short: stop caching */
  uint32_t i = (uint32_t)ne->hash & (SSLOTS - 1);
  for (uint32_t n = 0; n < SSLOTS; n++, i = (i + 1) & (SSLOTS - 1)) {
    if (!atomic_load_explicit(&variants[i], memory_order_acquire)) {
      atomic_store_explicit(&variants[i], ne, memory_order_release);
      atomic_fetch_add(&n_variants, 1);
      return;
    }
  }
}

void for_each_variant(kinfo *ki, void (*f)(sentry *, void *), void *arg) {
  for (uint32_t i = 0; i < SSLOTS; i++) {
    sentry *e = atomic_load_explicit(&variants[i], memory_order_acquire);
    if (e && e->ki == ki) f(e, arg);
  }
}

sentry *new_entry(kinfo *ki, gpu_ctx ctx, const uint8_t *key, int len, gpu_fn fn, int pending) {
  /* on a line of its own: a hit reads the header and a short key in one */
  sentry *ne = aligned_alloc(64, (sizeof *ne + (size_t)len + 63) & ~(size_t)63);
  if (!ne) return NULL;
  ne->hash = key_hash(ki, ctx, key, len);
  ne->ki = ki;
  ne->ctx = ctx;
  ne->keylen = len;
  atomic_init(&ne->fn, fn);
  atomic_init(&ne->pending, pending);
  atomic_init(&ne->trial, NULL);
  atomic_init(&ne->check, NULL);
  memcpy(ne->key, key, len);
  return ne;
}

/* The recorded kernel a launch handle stands for, with the launch counted (and traced); NULL
 * for a handle never registered with us. Shared by the CUDA and HIP launch paths. */
kinfo *launched_kernel(const void *handle, dim3 grid, dim3 block) {
  kinfo *ki = handle_lookup(handle);
  if (!ki) {
    atomic_fetch_add_explicit(&unknown_launches, 1, memory_order_relaxed);
    if (g_trace_launch) fprintf(stderr, "proteus: launch of unknown handle %p\n", handle);
    return NULL;
  }
  atomic_fetch_add_explicit(&ki->launches, 1, memory_order_relaxed);
  if (g_trace_launch)
    fprintf(stderr, "proteus: launch %s grid %u,%u,%u block %u,%u,%u\n", ki->name, grid.x, grid.y, grid.z, block.x, block.y,
            block.z);
  return ki;
}

/* The variant did not launch (the original runs instead): counted for the report. */
void launch_error(const void *handle) {
  kinfo *ki = handle_lookup(handle);
  if (ki) atomic_fetch_add_explicit(&ki->launch_errors, 1, memory_order_relaxed);
}

/* An unloaded image's memory may hold another image later: forget which kernels it had. */
void forget_owner(void *owner) {
  pthread_mutex_lock(&reg_lock);
  for (kinfo *k = all_kernels; k; k = k->next_all)
    if (k->owner == owner) k->image = NULL;   /* never matched again by find_kernel */
  for (image_reg *r = images; r; r = r->next)
    if (r->owner == owner) r->owner = NULL;
  pthread_mutex_unlock(&reg_lock);
}
