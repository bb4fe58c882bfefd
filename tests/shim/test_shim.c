/* Unit tests of the shim's hot-path pieces, without a GPU: hashing, the handle table, the
 * variant table, key building and policy changes. Built and run by tests/shim/test_shim.py. */
#define _GNU_SOURCE
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_api.h"
#include "hitpath.h"
#include "shim.h"

#include <assert.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>

static int failures;
#define EXPECT(cond) \
  do { \
    if (!(cond)) { \
      fprintf(stderr, "FAILED line %d: %s\n", __LINE__, #cond); \
      failures++; \
    } \
  } while (0)

static void test_hash(void) {
  uint8_t a[40] = {1, 2, 3}, b[40] = {1, 2, 3};
  EXPECT(hash_bytes(a, 40, 7) == hash_bytes(b, 40, 7));
  b[39] = 1;
  EXPECT(hash_bytes(a, 40, 7) != hash_bytes(b, 40, 7));
  EXPECT(hash_bytes(a, 3, 7) != hash_bytes(a, 4, 7));   /* length is part of the hash */
  EXPECT(hash_bytes(a, 8, 7) != hash_bytes(a, 8, 8));   /* so is the seed (kernel, context) */
  /* The variant table probes from the low 16 bits: keys that differ in one word (a step
   * counter's) or only in the second lane's word must spread over them like random ones
   * (65,536 keys in 65,536 slots: a longest run of about 8, and ~63% of the slots used). */
  for (int lane = 0; lane < 2; lane++) {
    static uint16_t load[1 << 16];
    memset(load, 0, sizeof load);
    uint8_t key[36] = {0};
    int most = 0, used = 0;
    for (uint32_t i = 0; i < (1u << 16); i++) {
      memcpy(key + 4 + 8 * lane, &i, 4);
      uint16_t slot = (uint16_t)hash_bytes(key, sizeof key, 99);
      if (!load[slot]++) used++;
      if (load[slot] > most) most = load[slot];
    }
    EXPECT(most <= 12 && used > 39000 && used < 44000);
  }
}

static void test_handles(void) {
  static kinfo k1, k2;
  pthread_mutex_lock(&reg_lock);
  for (uintptr_t i = 1; i <= 20000; i++) handle_insert((void *)(i * 64), (i & 1) ? &k1 : &k2, NULL);
  pthread_mutex_unlock(&reg_lock);
  int ok = 1;
  for (uintptr_t i = 1; i <= 20000; i++) ok &= handle_lookup((void *)(i * 64)) == ((i & 1) ? &k1 : &k2);
  EXPECT(ok);
  EXPECT(handle_lookup((void *)12345) == NULL);
  /* A handle registered again (another module loaded at the same address) takes its new
   * kernel and owner in place; its neighbours keep theirs. */
  static kinfo k3;
  pthread_mutex_lock(&reg_lock);
  handle_insert((void *)(7 * 64), &k3, (void *)0x5000);
  pthread_mutex_unlock(&reg_lock);
  EXPECT(handle_lookup((void *)(7 * 64)) == &k3 && handle_owner((void *)(7 * 64)) == (void *)0x5000);
  EXPECT(handle_lookup((void *)(9 * 64)) == &k1 && handle_owner((void *)(9 * 64)) == NULL);
  EXPECT(handle_owner((void *)12345) == NULL);
}

/* find_variant asks the kernel's last hit first: it must answer exactly what the table would,
 * whatever the key's length, context or generation, as launches alternate between variants. */
static void test_last_hit(void) {
  static kinfo ki;
  ki.nparams = 2;
  ki.sizes[0] = 4;
  ki.sizes[1] = 8;
  atomic_store(&ki.fold[0], 1);
  atomic_store(&ki.fold[1], 1);
  CUcontext c1 = (CUcontext)0x10, c2 = (CUcontext)0x20;
  sentry *made[3][2];
  uint8_t keys[3][MAX_KEY];
  int lens[3];
  for (int v = 0; v < 3; v++) {
    int a = 100 + v;
    uint64_t b = 7;
    void *params[2] = {&a, &b};
    dim3 d = {1, 1, 1};
    lens[v] = stable_key(&ki, params, d, d, keys[v]);
    for (int c = 0; c < 2; c++) {
      made[v][c] = new_entry(&ki, c ? c2 : c1, keys[v], lens[v], (CUfunction)(uintptr_t)(0x100 + 2 * v + c), 0);
      variant_insert(made[v][c]);
    }
  }
  int ok = 1;
  for (int i = 0; i < 60; i++) {   /* the same key twice in a row, then another, then another context */
    int v = (i / 2) % 3, c = (i / 6) % 2;
    ok &= find_variant(&ki, c ? c2 : c1, keys[v], lens[v]) == made[v][c];
  }
  EXPECT(ok);
  EXPECT(find_variant(&ki, c1, keys[1], lens[1]) == made[1][0] && atomic_load(&ki.last) == made[1][0]);
  EXPECT(find_variant(&ki, c1, keys[1], lens[1] - 1) == NULL);   /* a prefix of the last key */
  uint8_t other[MAX_KEY];
  memcpy(other, keys[1], lens[1]);
  other[0] += 2;   /* the same values under a later policy generation */
  EXPECT(find_variant(&ki, c1, other, lens[1]) == NULL);
  EXPECT(find_variant(&ki, (CUcontext)0x30, keys[1], lens[1]) == NULL);
  EXPECT(((uintptr_t)made[0][0] & 63) == 0);   /* entries start a cache line */
}

static void test_keys_and_variants(void) {
  static kinfo ki;
  ki.nparams = 4;
  uint32_t sizes[4] = {4, 8, 4, 1};
  uint8_t fold[4] = {1, 0, 1, 1};
  memcpy(ki.sizes, sizes, sizeof sizes);
  for (int i = 0; i < 4; i++) atomic_store(&ki.fold[i], fold[i]);
  atomic_store(&ki.dims_in_key, 1);
  int n = 42;
  void *ptr = (void *)0xdead;
  float f = 0.5f;
  uint8_t flag = 1;
  void *params[4] = {&n, &ptr, &f, &flag};
  uint8_t key[MAX_KEY];
  dim3 grid = {10, 1, 1}, block = {256, 1, 1};
  int len = stable_key(&ki, params, grid, block, key);
  EXPECT(len == 4 + 4 + 4 + 1 + 12);   /* generation; the pointer is not folded; block is in, grid is not */
  EXPECT(!memcmp(key + 4, &n, 4) && !memcmp(key + 8, &f, 4) && key[12] == 1);
  void *other_ptr = (void *)0xbeef;
  void *params2[4] = {&n, &other_ptr, &f, &flag};
  uint8_t key2[MAX_KEY];
  dim3 grid2 = {99, 1, 1};
  EXPECT(build_key(&ki, params2, grid2, block, key2, 0) == len && !memcmp(key, key2, len));   /* same variant */
  block.x = 128;
  build_key(&ki, params, grid, block, key2, 0);
  EXPECT(memcmp(key, key2, len) != 0);   /* another block size, another variant */

  CUcontext ctx = (CUcontext)0x1234;
  uint64_t h = key_hash(&ki, ctx, key, len);
  sentry *e = malloc(sizeof *e + len);
  e->hash = h;
  e->ki = &ki;
  e->ctx = ctx;
  e->fn = (CUfunction)0x77;
  e->pending = 0;
  e->keylen = len;
  memcpy(e->key, key, len);
  variant_insert(e);
  EXPECT(variant_lookup(h, &ki, ctx, key, len) == e);
  EXPECT(variant_lookup(h, &ki, (CUcontext)0x9999, key, len) == NULL);   /* per context */
  key[0] ^= 1;
  EXPECT(variant_lookup(h, &ki, ctx, key, len) == NULL);   /* same hash, other bytes: no false hit */

  /* A key too large for the stack buffer is refused, not truncated. */
  static kinfo big;
  big.nparams = 2;
  big.sizes[0] = MAX_KEY;
  big.fold[0] = 1;
  static uint8_t huge[MAX_KEY];
  void *bp[2] = {huge, huge};
  EXPECT(build_key(&big, bp, grid, block, key, 0) == -1);

  /* The tracker stops folding argument 0 and the block: the key changes generation and shrinks,
   * so no entry made under the old policy can match a key made under the new one. */
  uint8_t pol[4 + 4] = {0, 0, 0, 0, 0, 0, 1, 1};
  key[0] ^= 1;   /* (restore) */
  apply_policy(&ki, pol, sizeof pol);
  EXPECT(atomic_load(&ki.gen) == 2);
  int len2 = stable_key(&ki, params, grid, block, key2);
  EXPECT(len2 == 4 + 4 + 1 && key2[0] == 2 && !memcmp(key2 + 4, &f, 4));
  EXPECT(variant_lookup(key_hash(&ki, ctx, key2, len2), &ki, ctx, key2, len2) == NULL);
  apply_policy(&ki, pol, sizeof pol);   /* no change: no new generation */
  EXPECT(atomic_load(&ki.gen) == 2);
  apply_policy(&ki, pol, 3);   /* malformed: ignored */
  EXPECT(atomic_load(&ki.gen) == 2);
  atomic_store(&ki.gen, 3);   /* a policy change in progress: the hit path steps aside */
  EXPECT(stable_key(&ki, params, grid, block, key2) == -2);
  atomic_store(&ki.gen, 2);
}

/* Readers on the hit path while the policy changes: every key they build is one a single
 * generation could have produced. */
static kinfo race;
static _Atomic int race_stop, race_bad;
static void *race_reader(void *arg) {
  (void)arg;
  int a = 7, b = 9;
  void *params[2] = {&a, &b};
  dim3 d = {1, 1, 1};
  uint8_t key[MAX_KEY];
  while (!atomic_load(&race_stop)) {
    int len = stable_key(&race, params, d, d, key);
    if (len < 0) continue;
    uint32_t g;
    memcpy(&g, key, 4);
    int expect = 4 + ((g / 2) % 2 ? 4 : 8);   /* even generations fold both, odd halves fold one */
    if (len != expect) atomic_store(&race_bad, 1);
  }
  return NULL;
}
static void test_policy_race(void) {
  race.nparams = 2;
  race.sizes[0] = race.sizes[1] = 4;
  atomic_store(&race.fold[0], 1);
  atomic_store(&race.fold[1], 1);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, race_reader, NULL);
  uint8_t both[6] = {0, 0, 0, 0, 1, 1}, one[6] = {0, 0, 0, 0, 1, 0};
  for (int i = 0; i < 200000; i++) apply_policy(&race, i % 2 ? both : one, 6);
  atomic_store(&race_stop, 1);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  EXPECT(!atomic_load(&race_bad));
  EXPECT(atomic_load(&race.gen) == 400000);
}

/* The wait for a variant compiling in the background (auto mode): only a launch that asks
 * again for the variant the kernel's previous unserved launch asked for waits, only while its
 * stream has work queued, and it gets the function the compile thread publishes; a stream that
 * runs dry or a dropped job (exit) releases it without one. */
static _Atomic int gpu_busy = 1, queries;
static CUresult fake_query(CUstream s) {
  (void)s;
  atomic_fetch_add(&queries, 1);
  return atomic_load(&gpu_busy) ? 600 : CUDA_SUCCESS;
}
static CUresult fake_capturing(CUstream s, int *c) {
  *c = s == (CUstream)0xca9;
  return CUDA_SUCCESS;
}
static sentry *finishing;
static void *finish_compile(void *arg) {
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  atomic_store(&finishing->fn, (CUfunction)arg);
  atomic_store(&finishing->pending, 0);
  pthread_mutex_lock(&q_lock);
  pthread_cond_broadcast(&q_cond);
  pthread_mutex_unlock(&q_lock);
  return NULL;
}
static void *gpu_runs_dry(void *arg) {
  (void)arg;
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  atomic_store(&gpu_busy, 0);
  return NULL;
}
static void test_await_variant(void) {
  static kinfo ki;
  uint8_t k1[8] = {1}, k2[8] = {2};
  CUcontext ctx = (CUcontext)0x1234;
  CUstream s = (CUstream)0x5;
  sentry *a = new_entry(&ki, ctx, k1, 8, NULL, 1), *b = new_entry(&ki, ctx, k2, 8, NULL, 1);
  real_cuStreamQuery = fake_query;
  real_cuStreamIsCapturing = fake_capturing;
  g_async = ASYNC_AUTO;
  atomic_store(&ki.unserved, a->hash);   /* the launch that queued a */
  EXPECT(await_variant(&ki, b, s) == NULL && atomic_load(&queries) == 0);   /* another value: run the original at once */
  EXPECT(atomic_load(&ki.unserved) == b->hash);
  finishing = b;   /* b again, the GPU busy: wait for it */
  pthread_t t;
  pthread_create(&t, NULL, finish_compile, (void *)0x42);
  uint64_t t0 = now_ns();
  EXPECT(await_variant(&ki, b, s) == (CUfunction)0x42);
  EXPECT(now_ns() - t0 >= 15 * 1000 * 1000);
  pthread_join(t, NULL);
  EXPECT(atomic_load(&n_awaits) == 1);
  EXPECT(await_variant(&ki, a, (CUstream)0xca9) == NULL);   /* (a: a new value again) */
  EXPECT(await_variant(&ki, a, (CUstream)0xca9) == NULL && atomic_load(&n_awaits) == 1);   /* a capturing stream: no wait */
  EXPECT(atomic_load(&ki.check_skip) == 1);   /* and the next launch does not ask */
  int q = atomic_load(&queries);
  EXPECT(await_variant(&ki, a, s) == NULL && atomic_load(&queries) == q && atomic_load(&ki.check_skip) == 0);
  pthread_create(&t, NULL, gpu_runs_dry, NULL);   /* a, the GPU busy, then idle: the original runs */
  t0 = now_ns();
  EXPECT(await_variant(&ki, a, s) == NULL);
  EXPECT(now_ns() - t0 >= 15 * 1000 * 1000 && atomic_load(&a->pending) == 1 && atomic_load(&n_awaits) == 2);
  EXPECT(atomic_load(&ki.check_gap) == 0 && atomic_load(&ki.check_skip) == 0);   /* it found the stream busy */
  pthread_join(t, NULL);
  EXPECT(await_variant(&ki, a, s) == NULL && atomic_load(&n_awaits) == 2);   /* idle from the start: no wait */
  EXPECT(atomic_load(&n_checks) == 2);   /* that, and the capturing stream: checked, not waited */
  /* A host-bound loop: the stream asked at launches 1, 3, 6, 11, 20, 37, 70, 135, 200 of 200
   * (gaps 1, 2, 4, ... 64), then a busy stream ends the skipping. */
  atomic_store(&ki.check_skip, 0);
  atomic_store(&ki.check_gap, 0);
  q = atomic_load(&queries);
  for (int i = 0; i < 200; i++) EXPECT(await_variant(&ki, a, s) == NULL);
  EXPECT(atomic_load(&queries) - q == 9 && atomic_load(&ki.check_gap) == 64 && atomic_load(&n_awaits) == 2);
  atomic_store(&gpu_busy, 1);
  atomic_store(&ki.check_skip, 0);   /* the gap's end: the next launch asks, finds the GPU busy, waits */
  finishing = a;
  pthread_create(&t, NULL, finish_compile, (void *)0x43);
  EXPECT(await_variant(&ki, a, s) == (CUfunction)0x43 && atomic_load(&n_awaits) == 3 && atomic_load(&ki.check_gap) == 0);
  pthread_join(t, NULL);
  atomic_store(&a->pending, 1);
  atomic_store(&a->fn, NULL);
  g_async = ASYNC_ON;   /* upstream's asynchronous mode never waits */
  EXPECT(await_variant(&ki, a, s) == NULL && atomic_load(&n_awaits) == 3);
  g_async = ASYNC_AUTO;   /* exiting: a dropped job's entry stops pending, and waiters stop */
  job *j = calloc(1, sizeof *j);
  j->e = a;
  j->ki = &ki;
  j->args = malloc(1);
  j->addrs = malloc(8);
  q_head = q_tail = j;
  atomic_store(&ki.jobs, 1);
  stop_workers();
  EXPECT(atomic_load(&a->pending) == 0 && q_head == NULL && atomic_load(&ki.jobs) == 0);
  atomic_store(&a->pending, 1);   /* as if still compiling: q_stop ends the wait at once */
  t0 = now_ns();
  EXPECT(await_variant(&ki, a, s) == NULL && now_ns() - t0 < 5 * 1000 * 1000);
  free(a);
  free(b);
}

/* At exit the compile threads finish their queue (a stale job is dropped unread by the
 * worker, which clears its function) before they stop. */
static void test_exit_drains_the_queue(void) {
  static kinfo k;
  atomic_store(&k.gen, 2);
  sentry *e[3];
  for (int i = 0; i < 3; i++) {
    uint8_t key[4] = {(uint8_t)i};
    e[i] = new_entry(&k, (CUcontext)0x1, key, 4, (CUfunction)0x99 /* the worker overwrites it */, 1);
    job *j = calloc(1, sizeof *j);
    j->ki = &k;
    j->gen = 0;
    j->e = e[i];
    j->args = malloc(1);
    j->addrs = malloc(8);
    if (q_tail) q_tail->next = j;
    else q_head = j;
    q_tail = j;
  }
  atomic_store(&k.jobs, 3);
  pthread_t w;
  q_workers = 1;
  pthread_create(&w, NULL, worker, NULL);
  pthread_detach(w);   /* stopped, it waits for the process to end (park_for_exit) */
  stop_workers();
  for (int i = 0; i < 3; i++) EXPECT(atomic_load(&e[i]->pending) == 0 && atomic_load(&e[i]->fn) == NULL);
  EXPECT(q_head == NULL && q_busy == 0 && q_stop == 1 && atomic_load(&k.jobs) == 0);
  q_stop = 0;
  q_workers = 0;
  for (int i = 0; i < 3; i++) free(e[i]);
}

/* defer(): a launch with a new key while a variant of its kernel is queued is kept for the
 * tracker (runtime.DEFERRED records, in order), up to defer_max; not with nothing queued, not
 * for a kernel without a tracker (defer_max 0), not in synchronous mode. */
static void test_defer(void) {
  static kinfo ki;
  ki.nparams = 2;
  ki.sizes[0] = 4;
  ki.sizes[1] = 8;
  ki.defer_max = 3;
  uint32_t a = 0;
  uint64_t b = 0x1122334455667788ull;
  void *params[2] = {&a, &b};
  dim3 grid = {1, 2, 3}, block = {4, 5, 6};
  g_async = ASYNC_AUTO;
  EXPECT(!defer(&ki, params, grid, block));   /* nothing queued: the miss asks Python */
  atomic_store(&ki.jobs, 1);
  for (a = 0; a < 3; a++) EXPECT(defer(&ki, params, grid, block));
  EXPECT(!defer(&ki, params, grid, block) && ki.ndeferred == 3 && atomic_load(&n_deferred) == 3);   /* full */
  EXPECT(deferred_bytes(&ki) == 3 * (24 + 12));
  for (uint32_t i = 0; i < 3; i++) {
    const uint8_t *r = ki.deferred + i * 36;
    uint32_t dims[6], got_a;
    uint64_t got_b;
    memcpy(dims, r, 24);
    memcpy(&got_a, r + 24, 4);
    memcpy(&got_b, r + 28, 8);
    EXPECT(dims[0] == 1 && dims[2] == 3 && dims[3] == 4 && dims[5] == 6 && got_a == i && got_b == b);
  }
  ki.ndeferred = 0;   /* (what a miss that passed them to Python does) */
  g_async = ASYNC_OFF;
  EXPECT(!defer(&ki, params, grid, block));
  g_async = ASYNC_ON;
  EXPECT(defer(&ki, params, grid, block));
  ki.ndeferred = 0;
  ki.defer_max = 0;
  EXPECT(!defer(&ki, params, grid, block));
  g_async = -1;
  free(ki.deferred);
}

/* PROTEUS_ASYNC_COMPILATION as config.py reads it: unset, blank or auto; 1/true/yes/on; 0/off. */
static void test_async_env(void) {
  const char *values[] = {NULL, "", " Auto ", "1", "on", "0", "off"};
  int want[] = {ASYNC_AUTO, ASYNC_AUTO, ASYNC_AUTO, ASYNC_ON, ASYNC_ON, ASYNC_OFF, ASYNC_OFF};
  for (int i = 0; i < 7; i++) {
    if (values[i]) setenv("PROTEUS_ASYNC_COMPILATION", values[i], 1);
    else unsetenv("PROTEUS_ASYNC_COMPILATION");
    g_async = -1;
    read_async_env();
    EXPECT(g_async == want[i]);
  }
  unsetenv("PROTEUS_ASYNC_COMPILATION");
  /* PROTEUS_ASYNC_THREADS: unset or auto, a thread per 4 CPUs, 1 to 4; a number, 1 to 64 */
  EXPECT(compile_threads(NULL, 2) == 1 && compile_threads(NULL, 9) == 2 && compile_threads("", 16) == 4);
  EXPECT(compile_threads(" AUTO", 128) == 4 && compile_threads("3", 2) == 3 && compile_threads("0", 16) == 1);
  EXPECT(compile_threads("999", 16) == 64);
}

/* GPU time samples: the 2nd launch, every 64th until 16 samples, then every 4,096th; the
 * budget's estimate is their mean times the launches. */
static _Atomic int records;
static CUresult fake_ctx(CUcontext *c) {
  *c = (CUcontext)0x77;
  return CUDA_SUCCESS;
}
static CUresult fake_record(void *ev, CUstream s) {
  (void)ev;
  (void)s;
  atomic_fetch_add(&records, 1);
  return CUDA_SUCCESS;
}
static CUresult fake_event_query(void *ev) {
  (void)ev;
  return CUDA_SUCCESS;
}
static CUresult fake_elapsed(float *ms, void *a, void *b) {
  (void)a;
  (void)b;
  *ms = 0.5f;
  return CUDA_SUCCESS;
}
static void test_gpu_time_samples(void) {
  static kinfo ki;
  real_cuCtxGetCurrent = fake_ctx;
  real_cuStreamIsCapturing = fake_capturing;
  real_cuEventRecord = fake_record;
  real_cuEventQuery = fake_event_query;
  real_cuEventElapsedTime = fake_elapsed;
  ki.ev_ctx = (CUcontext)0x77;
  atomic_store(&ki.sample_state, SAMPLE_IDLE);
  for (int i = 0; i < 20000; i++) {
    atomic_fetch_add(&ki.launches, 1);
    sample_poll(&ki);
    trial_ticket none = {0};
    int started = sample_begin(&ki, (CUstream)0x5, &none);
    sample_end(&ki, (CUstream)0x5, started, &none);
    if (i + 1 == 1100) EXPECT(atomic_load(&ki.samples) == 16 && atomic_load(&records) == 32);   /* launches 2, 66, ... 962 */
  }
  /* then 4098, 8194, 12290, 16386 (the last collected on the next launch) */
  EXPECT(atomic_load(&ki.samples) == 20 && atomic_load(&records) == 40);
  EXPECT(gpu_ms(&ki) > 9999.0 && gpu_ms(&ki) < 10001.0);   /* 0.5 ms x 20,000 launches */
}

/* Speed trials (trial.c): from its first launch a variant takes timed turns with the original,
 * variant first, each with events of its own; it is judged as soon as the times in show it
 * (sides apart: one launch a side for a long kernel, two for a short one), at the latest once
 * every turn is in (by the medians); measured slower, it is dropped: its entry's function
 * cleared, so launches run the original. */
static trial *cur_trial;
static float turn_ms[2], first_ms;   /* the original's and the variant's time; the first turn of each side */
static CUresult query_answer = CUDA_SUCCESS;
static uintptr_t next_event = 0x1000;
static int creates_left = -1;   /* events the driver makes before it fails (-1: no limit) */
static _Atomic int destroyed;
static CUresult fake_event_create(void **ev, unsigned flags) {
  (void)flags;
  if (creates_left == 0) return 2;   /* CUDA_ERROR_OUT_OF_MEMORY */
  if (creates_left > 0) creates_left--;
  *ev = (void *)next_event++;
  return CUDA_SUCCESS;
}
static CUresult fake_event_destroy(void *ev) {
  (void)ev;
  atomic_fetch_add(&destroyed, 1);
  return CUDA_SUCCESS;
}
static CUresult turn_query(void *ev) {
  (void)ev;
  return query_answer;
}
static CUresult turn_elapsed(float *ms, void *a, void *b) {
  (void)b;
  int k = 0;
  while (k < TRIAL_TURNS && cur_trial->ev[2 * k] != a) k++;
  int variant = (k & 1) ^ !cur_trial->original_first;
  *ms = k < 2 && first_ms > 0 ? first_ms : turn_ms[variant];
  return CUDA_SUCCESS;
}
/* A trial to its verdict, one launch at a time (each turn's time is in before the next launch):
 * the verdict, and in *turns the turns it took. */
static int run_trial(float original_ms, float variant_ms, float first, uint32_t flags, CUfunction *left, int *originals,
                     int *turns) {
  static kinfo ki;
  memset(&ki, 0, sizeof ki);
  ki.ev_ctx = (CUcontext)0x77;
  ki.ev[0] = (void *)0x1;
  ki.ev[1] = (void *)0x2;
  atomic_store(&ki.launches, 1000);   /* no plain GPU-time sample on these launches */
  real_cuEventCreate = fake_event_create;
  real_cuEventQuery = turn_query;
  real_cuEventElapsedTime = turn_elapsed;
  turn_ms[0] = original_ms;
  turn_ms[1] = variant_ms;
  first_ms = first;
  *originals = *turns = 0;
  uint8_t key[8] = {1};
  sentry *e = new_entry(&ki, NULL, key, 8, (CUfunction)0xfa57, 0);
  trial_attach(&ki, e, 3, PROTO_IMAGE_TRIAL | flags, (CUfunction)0xfa57);
  if (!(cur_trial = atomic_load(&e->trial)) || cur_trial->vid != 2) return -1;
  for (int i = 0; i < 100 && atomic_load(&e->trial); i++) {
    trial_ticket tk = {0};
    CUfunction f = trial_pick(&ki, e, atomic_load(&e->fn), &tk);
    if (i == 0 && !tk.t) return -2;   /* the first launch is a turn */
    if (tk.t && (f != NULL) != ((tk.turn & 1) ^ !cur_trial->original_first)) return -3;   /* the sides alternate */
    *originals += tk.t && !f;
    *turns += tk.t != NULL;
    int started = sample_begin(&ki, (CUstream)0x5, &tk);
    sample_end(&ki, (CUstream)0x5, started, &tk);
  }
  *left = atomic_load(&e->fn);
  return atomic_load(&cur_trial->verdict);
}
static void test_speed_trial(void) {
  real_cuCtxGetCurrent = fake_ctx;
  real_cuStreamIsCapturing = fake_capturing;
  real_cuEventRecord = fake_record;
  CUfunction left = NULL;
  int originals = 0, turns = 0;
  real_cuEventDestroy = fake_event_destroy;
  /* a long kernel whose variant is clearly faster: one launch a side */
  EXPECT(run_trial(2.00f, 1.60f, 0, 0, &left, &originals, &turns) == TRIAL_KEPT);
  EXPECT(left == (CUfunction)0xfa57 && originals == 1 && turns == 2);
  /* its 24 events freed once judged, by the next miss, not by the launch that judged it */
  EXPECT(atomic_load(&destroyed) == 0 && cur_trial->ev[0] != NULL);
  trial_release();
  EXPECT(atomic_load(&destroyed) == 2 * TRIAL_TURNS && cur_trial->ev[0] == NULL && cur_trial->ev[2 * TRIAL_TURNS - 1] == NULL);
  trial_release();
  EXPECT(atomic_load(&destroyed) == 2 * TRIAL_TURNS);
  /* clearly slower: dropped as soon as seen */
  EXPECT(run_trial(2.00f, 2.20f, 0, 0, &left, &originals, &turns) == TRIAL_SLOWER);
  EXPECT(left == NULL && originals == 1 && turns == 2);
  /* a short kernel needs two launches a side */
  EXPECT(run_trial(0.010f, 0.020f, 0, 0, &left, &originals, &turns) == TRIAL_SLOWER && turns == 4); /* 10 us: beyond the floor */
  EXPECT(run_trial(0.0020f, 0.0028f, 0, 0, &left, &originals, &turns) == TRIAL_KEPT); /* 0.8 us: within it */
  EXPECT(turns == TRIAL_TURNS && originals == TRIAL_RUNS); /* not decided before the last turn */
  /* within the margin: every turn, then kept */
  EXPECT(run_trial(1.00f, 1.005f, 0, 0, &left, &originals, &turns) == TRIAL_KEPT && left == (CUfunction)0xfa57);
  EXPECT(turns == TRIAL_TURNS);
  /* 2% slower, the first launch of each side slow (code loading): the medians decide */
  EXPECT(run_trial(0.060f, 0.0612f, 0.5f, 0, &left, &originals, &turns) == TRIAL_SLOWER && turns == TRIAL_TURNS);
  /* an earlier run timed the variant more: this one starts with the original */
  EXPECT(run_trial(2.00f, 1.60f, 0, PROTO_IMAGE_ORIGINAL_FIRST, &left, &originals, &turns) == TRIAL_KEPT);
  EXPECT(originals == 1 && turns == 2 && cur_trial->n[0] == 1 && cur_trial->n[1] == 1);
  /* turns need not wait for the last one's time (a GPU-bound queue): all go out back to back;
   * launches after them run the variant until the GPU has every turn's time */
  static kinfo busy;
  busy.ev[1] = (void *)0x2;
  atomic_store(&busy.launches, 1000);
  uint8_t k3[8] = {3};
  sentry *b = new_entry(&busy, NULL, k3, 8, (CUfunction)0xb, 0);
  trial_attach(&busy, b, 1, PROTO_IMAGE_TRIAL, (CUfunction)0xb);
  cur_trial = atomic_load(&b->trial);
  turn_ms[0] = 1.0f;
  turn_ms[1] = 2.0f;
  first_ms = 2.0f;
  query_answer = 600; /* CUDA_ERROR_NOT_READY */
  int turns_busy = 0, originals_busy = 0;
  for (int i = 0; i < TRIAL_TURNS + 5; i++) {
    trial_ticket tk = {0};
    CUfunction f = trial_pick(&busy, b, (CUfunction)0xb, &tk);
    turns_busy += tk.t != NULL;
    originals_busy += f == NULL;
    sample_end(&busy, (CUstream)0x5, sample_begin(&busy, (CUstream)0x5, &tk), &tk);
  }
  EXPECT(turns_busy == TRIAL_TURNS && originals_busy == TRIAL_RUNS && atomic_load(&busy.timing) == TRIAL_RUNS);
  EXPECT(atomic_load(&cur_trial->verdict) == TRIAL_RUNNING);
  query_answer = CUDA_SUCCESS;
  trial_ticket tk = {0};
  EXPECT(trial_pick(&busy, b, (CUfunction)0xb, &tk) == NULL && atomic_load(&cur_trial->verdict) == TRIAL_SLOWER);
  /* the driver made 5 of a trial's events and then failed: no trial, and those 5 freed */
  static kinfo few;
  few.ev[1] = (void *)0x2;
  uint8_t k4[8] = {4};
  sentry *f4 = new_entry(&few, NULL, k4, 8, (CUfunction)0xf, 0);
  creates_left = 5;
  atomic_store(&destroyed, 0);
  trial_attach(&few, f4, 1, PROTO_IMAGE_TRIAL, (CUfunction)0xf);
  creates_left = -1;
  trial *t4 = atomic_load(&f4->trial);
  EXPECT(!t4 || (!t4->timed_trial && atomic_load(&t4->verdict) == TRIAL_ENDED));
  EXPECT(atomic_load(&destroyed) == 5);
  /* no events (HIP, or none could be made): no trial */
  static kinfo off;
  atomic_store(&off.sample_state, SAMPLE_OFF);
  uint8_t key[8] = {2};
  sentry *e = new_entry(&off, NULL, key, 8, (CUfunction)0x1, 0);
  trial_attach(&off, e, 1, PROTO_IMAGE_TRIAL, (CUfunction)0x1);
  EXPECT(atomic_load(&e->trial) == NULL);
  real_cuEventQuery = fake_event_query;
}

/* Stream capture: a launch into a capture runs the original even where a variant is loaded
 * (a graph's kernel node may get other arguments later), counted; the hit path asks the driver
 * only while a capture is open; a miss into a capture does nothing (no resolution, no load). */
static CUfunction launched_fn;
static CUresult fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, CUstream s, void **p, void **e) {
  (void)gx;
  (void)gy;
  (void)gz;
  (void)bx;
  (void)by;
  (void)bz;
  (void)shmem;
  (void)s;
  (void)p;
  (void)e;
  launched_fn = f;
  return CUDA_SUCCESS;
}
static _Atomic int capturing_asked;
static CUresult counting_capturing(CUstream s, int *c) {
  atomic_fetch_add(&capturing_asked, 1);
  return fake_capturing(s, c);
}
static CUresult fake_begin(CUstream s, int mode) {
  (void)s;
  (void)mode;
  return CUDA_SUCCESS;
}
static CUresult fake_end(CUstream s, void **g) {
  (void)s;
  *g = NULL;
  return CUDA_SUCCESS;
}
static void test_stream_capture(void) {
  static kinfo ki, unresolved;
  real_cuCtxGetCurrent = fake_ctx;
  real_cuStreamIsCapturing = counting_capturing;
  real_cuLaunchKernel = fake_launch;
  real_cuStreamBeginCapture_v2 = fake_begin;
  real_cuStreamEndCapture = fake_end;
  ki.nparams = 1;
  ki.sizes[0] = 4;
  atomic_store(&ki.fold[0], 1);
  ki.name = "k";
  atomic_store(&ki.state, K_ACTIVE);
  unresolved.name = "u";
  pthread_mutex_lock(&reg_lock);
  handle_insert((void *)0xf00, &ki, NULL);
  handle_insert((void *)0xf01, &unresolved, NULL);
  pthread_mutex_unlock(&reg_lock);
  int a = 5;
  void *params[1] = {&a};
  dim3 d = {1, 1, 1};
  uint8_t key[MAX_KEY];
  int len = stable_key(&ki, params, d, d, key);
  variant_insert(new_entry(&ki, (CUcontext)0x77, key, len, (CUfunction)0xbee, 0));
  CUstream plain = (CUstream)0x5, cap = (CUstream)0xca9;

  cuLaunchKernel((CUfunction)0xf00, 1, 1, 1, 1, 1, 1, 0, plain, params, NULL);
  EXPECT(launched_fn == (CUfunction)0xbee && atomic_load(&capturing_asked) == 0); /* a hit; no capture open: not asked */
  EXPECT(cuStreamBeginCapture_v2(cap, 0) == CUDA_SUCCESS && atomic_load(&captures_open) == 1);
  cuLaunchKernel((CUfunction)0xf00, 1, 1, 1, 1, 1, 1, 0, cap, params, NULL);
  EXPECT(launched_fn == (CUfunction)0xf00 && atomic_load(&ki.captured) == 1); /* into the graph: the original */
  cuLaunchKernel((CUfunction)0xf00, 1, 1, 1, 1, 1, 1, 0, plain, params, NULL);
  EXPECT(launched_fn == (CUfunction)0xbee && atomic_load(&ki.captured) == 1); /* another stream still hits */
  cuLaunchKernel((CUfunction)0xf01, 1, 1, 1, 1, 1, 1, 0, cap, params, NULL); /* a first launch, captured */
  EXPECT(launched_fn == (CUfunction)0xf01 && atomic_load(&unresolved.captured) == 1 &&
         atomic_load(&unresolved.state) == K_UNRESOLVED);
  /* while the capture is open: no event record or query on any launch (HeCBench graphExecution
   * crashed now and then when a pending sample was collected inside its capture) */
  int before = atomic_load(&records);
  atomic_store(&ki.sample_state, SAMPLE_PENDING);
  atomic_store(&ki.launches, 1); /* the next launch is the 2nd: one that starts a sample */
  cuLaunchKernel((CUfunction)0xf00, 1, 1, 1, 1, 1, 1, 0, plain, params, NULL);
  EXPECT(atomic_load(&ki.sample_state) == SAMPLE_PENDING && atomic_load(&records) == before);
  atomic_store(&ki.sample_state, SAMPLE_IDLE);
  void *graph;
  EXPECT(cuStreamEndCapture(cap, &graph) == CUDA_SUCCESS && atomic_load(&captures_open) == 0);
  EXPECT(cuStreamEndCapture(plain, &graph) == CUDA_SUCCESS && atomic_load(&captures_open) == 0); /* none open there */
  int asked = atomic_load(&capturing_asked);
  cuLaunchKernel((CUfunction)0xf00, 1, 1, 1, 1, 1, 1, 0, plain, params, NULL);
  EXPECT(launched_fn == (CUfunction)0xbee && atomic_load(&capturing_asked) == asked);
}

/* Graphs (cuda_graph.c) over a fake driver: a template of three nodes (a kernel node whose
 * variant is loaded, one whose variant is compiling, a memset), its exec, a copy for updates. */
typedef struct {
  void *exec, *node;
  knode p;
  int arg0; /* the first two arguments' values at the call: the driver copies them then, and */
  void *arg1; /* the shim may free what p.params points to once the call returns */
} set_call;
static set_call sets[16];
static int nsets, destroyed_template, updated_with_copy;
static knode tmpl[3];
static void *const TEMPLATE = (void *)0x6a0, *const COPY = (void *)0xc09, *const EXEC = (void *)0xe8e;
static void *const NODES[3] = {(void *)0xa1, (void *)0xa2, (void *)0xa3}, *const COPY_NODES[3] = {(void *)0xb1, (void *)0xb2,
                                                                                                  (void *)0xb3};
static knode copy_params[3];
static int node_index(void *n) {
  for (int i = 0; i < 3; i++)
    if (n == NODES[i] || n == COPY_NODES[i]) return i;
  return -1;
}
static CUresult g_get_nodes(void *g, void **nodes, size_t *n) {
  if (nodes) memcpy(nodes, g == COPY ? COPY_NODES : NODES, 3 * sizeof(void *));
  *n = 3;
  return CUDA_SUCCESS;
}
static CUresult g_type(void *n, int *t) {
  *t = node_index(n) == 2 ? 8 /* memset */ : 0;
  return CUDA_SUCCESS;
}
static CUresult g_get(void *n, knode *p) {
  *p = node_index(n) >= 0 && (n == COPY_NODES[0] || n == COPY_NODES[1]) ? copy_params[node_index(n)] : tmpl[node_index(n)];
  return CUDA_SUCCESS;
}
static CUresult g_exec_set(void *e, void *n, const knode *p) {
  set_call c = {e, n, *p, 0, NULL};
  if (p->params && p->params[0] && p->params[1]) {
    memcpy(&c.arg0, p->params[0], sizeof c.arg0);
    memcpy(&c.arg1, p->params[1], sizeof c.arg1);
  }
  sets[nsets++] = c;
  return CUDA_SUCCESS;
}
static CUresult g_set(void *n, const knode *p) {
  copy_params[node_index(n)] = *p;
  return CUDA_SUCCESS;
}
static CUresult g_attr(void *n, int a, void *v) {
  (void)n;
  (void)a;
  memset(v, 0, 64);
  return CUDA_SUCCESS;
}
static CUresult g_clone(void **c, void *g) {
  (void)g;
  *c = COPY;
  memcpy(copy_params, tmpl, sizeof copy_params);
  return CUDA_SUCCESS;
}
static CUresult g_destroy(void *g) {
  if (g == TEMPLATE) destroyed_template++;
  return CUDA_SUCCESS;
}
static CUresult g_update(void *e, void *g, void *r) {
  (void)e;
  (void)r;
  updated_with_copy = g == COPY;
  return CUDA_SUCCESS;
}
static CUresult g_instantiate(void **e, void *g, unsigned long long f) {
  (void)g;
  (void)f;
  *e = EXEC;
  return CUDA_SUCCESS;
}
static CUresult g_launch(void *e, CUstream s) {
  (void)e;
  (void)s;
  return CUDA_SUCCESS;
}
static CUresult g_exec_destroy(void *e) {
  (void)e;
  return CUDA_SUCCESS;
}
static int kernel_functions;
static CUresult g_kernel_function(CUfunction *f, CUkernel k) {
  kernel_functions++;
  *f = (CUfunction)(0xf100 + (uintptr_t)k);
  return CUDA_SUCCESS;
}
static void test_graphs(void) {
  static kinfo ki;
  real_cuCtxGetCurrent = fake_ctx;
  real_cuGraphGetNodes = g_get_nodes;
  real_cuGraphNodeGetType = g_type;
  real_cuGraphKernelNodeGetParams_v2 = g_get;
  real_cuGraphExecKernelNodeSetParams_v2 = g_exec_set;
  real_cuGraphKernelNodeSetParams_v2 = g_set;
  real_cuGraphKernelNodeGetAttribute = g_attr;
  real_cuGraphClone = g_clone;
  real_cuGraphDestroy = g_destroy;
  real_cuGraphExecUpdate_v2 = g_update;
  real_cuGraphInstantiateWithFlags = g_instantiate;
  real_cuGraphLaunch = g_launch;
  real_cuGraphExecDestroy = g_exec_destroy;
  ki.nparams = 2;
  ki.sizes[0] = 4;
  ki.sizes[1] = 8;
  atomic_store(&ki.fold[0], 1); /* the pointer is not folded */
  ki.name = "g";
  atomic_store(&ki.state, K_ACTIVE);
  pthread_mutex_lock(&reg_lock);
  handle_insert((void *)0xf10, &ki, NULL);
  pthread_mutex_unlock(&reg_lock);
  static int n5 = 5, n6 = 6, n7 = 7;
  static void *buf = (void *)0x1234;
  void *args5[2] = {&n5, &buf}, *args6[2] = {&n6, &buf}, *args7[2] = {&n7, &buf};
  dim3 g = {4, 1, 1}, b = {128, 1, 1};
  uint8_t key[MAX_KEY];
  int len = stable_key(&ki, args5, g, b, key);
  variant_insert(new_entry(&ki, (CUcontext)0x77, key, len, (CUfunction)0xbee, 0));
  len = stable_key(&ki, args6, g, b, key);
  sentry *compiling = new_entry(&ki, (CUcontext)0x77, key, len, NULL, 1);
  variant_insert(compiling);
  len = stable_key(&ki, args7, g, b, key);
  variant_insert(new_entry(&ki, (CUcontext)0x77, key, len, (CUfunction)0xbe7, 0));
  for (int i = 0; i < 2; i++) tmpl[i] = (knode){(CUfunction)0xf10, 4, 1, 1, 128, 1, 1, 0, i ? args6 : args5, NULL, NULL, NULL};

  void *exec = NULL;
  EXPECT(w_cuGraphInstantiateWithFlags(&exec, TEMPLATE, 0) == CUDA_SUCCESS && exec == EXEC);
  /* the loaded variant is set on the exec, never on the template; the compiling one waits */
  EXPECT(nsets == 1 && sets[0].node == NODES[0] && sets[0].p.func == (CUfunction)0xbee && sets[0].p.params == args5);
  EXPECT(tmpl[0].func == (CUfunction)0xf10 && atomic_load(&ki.graph_nodes) == 1);
  EXPECT(w_cuGraphLaunch(EXEC, NULL) == CUDA_SUCCESS && nsets == 1); /* still compiling: nothing to do */
  /* the template destroyed while a node waits: put off until the wait ends */
  EXPECT(w_cuGraphDestroy(TEMPLATE) == CUDA_SUCCESS && destroyed_template == 0);
  atomic_store(&compiling->fn, (CUfunction)0xbe6);
  atomic_store(&compiling->pending, 0);
  args6[0] = &n5; /* the app's arguments may change after instantiation: the node keeps its own copy */
  EXPECT(w_cuGraphLaunch(EXEC, NULL) == CUDA_SUCCESS && nsets == 2 && sets[1].node == NODES[1]);
  EXPECT(sets[1].p.func == (CUfunction)0xbe6 && sets[1].arg0 == 6 && sets[1].arg1 == buf);
  EXPECT(destroyed_template == 1 && atomic_load(&ki.graph_nodes) == 2);
  args6[0] = &n6;
  EXPECT(w_cuGraphLaunch(EXEC, NULL) == CUDA_SUCCESS && nsets == 2);

  /* the app sets node 0's parameters: the variant for the new arguments, or its own function */
  knode p7 = {(CUfunction)0xf10, 4, 1, 1, 128, 1, 1, 0, args7, NULL, NULL, NULL};
  EXPECT(w_cuGraphExecKernelNodeSetParams_v2(EXEC, NODES[0], &p7) == CUDA_SUCCESS);
  EXPECT(nsets == 3 && sets[2].p.func == (CUfunction)0xbe7 && sets[2].p.params == args7);
  /* with PROTEUS_VALIDATE=1 (every variant checked) nothing of a graph is touched */
  g_validate = VALIDATE_FULL;
  EXPECT(w_cuGraphExecKernelNodeSetParams_v2(EXEC, NODES[0], &p7) == CUDA_SUCCESS && sets[3].p.func == (CUfunction)0xf10);
  g_validate = VALIDATE_OFF;
  nsets = 0;

  /* an update: the exec takes a copy of the app's graph with its kernel nodes on their variants */
  memcpy(copy_params, tmpl, sizeof copy_params);
  tmpl[1].params = args7;
  EXPECT(w_cuGraphExecUpdate_v2(EXEC, TEMPLATE, NULL) == CUDA_SUCCESS && updated_with_copy);
  EXPECT(copy_params[0].func == (CUfunction)0xbee && copy_params[1].func == (CUfunction)0xbe7 &&
         tmpl[1].func == (CUfunction)0xf10);
  EXPECT(nsets == 0);
  EXPECT(w_cuGraphExecDestroy(EXEC) == CUDA_SUCCESS);

  /* a node of a kernel not recorded (a library's): the CUkernels are asked once, not at
   * every instantiation; one of a recorded kernel's CUkernel, found and remembered */
  static kinfo lk;
  lk.nparams = 0;
  lk.name = "lib";
  atomic_store(&lk.state, K_DISABLED);
  pthread_mutex_lock(&reg_lock);
  handle_insert((void *)0xc1, &lk, NULL);
  pthread_mutex_unlock(&reg_lock);
  graph_library_kernel((CUkernel)0xc1);
  real_cuKernelGetFunction = g_kernel_function;
  knode foreign = {(CUfunction)0xf0f0, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL, NULL};
  int asked = kernel_functions;
  EXPECT(w_cuGraphExecKernelNodeSetParams_v2(EXEC, NODES[0], &foreign) == CUDA_SUCCESS && kernel_functions == asked + 1);
  EXPECT(w_cuGraphExecKernelNodeSetParams_v2(EXEC, NODES[0], &foreign) == CUDA_SUCCESS && kernel_functions == asked + 1);
  EXPECT(sets[nsets - 1].p.func == (CUfunction)0xf0f0); /* left as the app set it */
  knode mine = foreign;
  mine.func = (CUfunction)0xf1c1; /* the function of CUkernel 0xc1 (g_kernel_function) */
  EXPECT(w_cuGraphExecKernelNodeSetParams_v2(EXEC, NODES[0], &mine) == CUDA_SUCCESS && handle_lookup((void *)0xf1c1) == &lk);

  /* the entry points the driver hands out: the version asked for picks the signature */
  void *real = (void *)g_launch;
  EXPECT(graph_proc("cuGraphExecKernelNodeSetParams", real, 12000, 0) == (void *)w_cuGraphExecKernelNodeSetParams_v2);
  EXPECT(graph_proc("cuGraphExecKernelNodeSetParams", real, 11040, 0) == (void *)w_cuGraphExecKernelNodeSetParams);
  EXPECT(graph_proc("cuGraphInstantiate", real, 13000, 0) == (void *)w_cuGraphInstantiateWithFlags);
  EXPECT(graph_proc("cuGraphInstantiate", real, 11000, 0) == (void *)w_cuGraphInstantiate_v2);
  EXPECT(graph_proc("cuGraphLaunch", real, 10000, 1) == (void *)w_cuGraphLaunch_ptsz && real_cuGraphLaunch_ptsz == g_launch);
  EXPECT(graph_proc("cuGraphicsMapResources", real, 3000, 0) == real);
  real_cuGraphLaunch = g_launch;
}

/* An app that ends with exit() from main: main's end is taken there (its CPU is not: exit
 * may come from another thread). In a child, since exit ends the process. */
static void check_main_times(void) { _exit(atomic_load(&t_main_end_ns) > atomic_load(&t_main_start_ns) ? 0 : 3); }
static void test_exit_from_main_times_main(void) {
  pid_t pid = fork();
  if (pid == 0) {
    atomic_store(&t_main_start_ns, now_ns());
    atexit(check_main_times);
    exit(0); /* the shim's exit, as the app's would be */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The warm-start thread (cuda_warm.c) wakes for fat binaries inside a loaded object only (an
 * app's own buffer may be gone when it reads it) and stops at exit. Python is not started here:
 * had the thread asked it about the heap image, this test would crash. */
static void *run_warm(void *arg) {
  (void)arg;
  warm_start();
  return NULL;
}
static void test_warm_start(void) {
  pthread_t t;
  setenv(ENV_PRELOAD, "0", 1); /* off: returns at once */
  pthread_create(&t, NULL, run_warm, NULL);
  pthread_join(t, NULL);
  unsetenv(ENV_PRELOAD); /* on by default */
  pthread_create(&t, NULL, run_warm, NULL);
  char *heap = malloc(4096);
  memset(heap, 0, 4096);
  warm_image(heap); /* not inside a loaded object: nothing to ask about */
  usleep(20 * 1000);
  uint64_t t0 = now_ns();
  warm_finish();
  pthread_join(t, NULL);
  EXPECT(now_ns() - t0 < 1000 * 1000 * 1000ull);
  EXPECT(atomic_load(&n_preloaded) == 0);
  unsetenv(ENV_PRELOAD);
  free(heap);
}

/* A static cudart names its fat binaries only once it has a context; the scan finds them in the
 * .nvFatBinSegment sections of the objects loaded: a wrapper counts only with its magic number
 * and a fat binary's. In a child, which loads a library of such wrappers (fake_fatbins.c). */
static void test_warm_scan(void) {
  EXPECT(warm_scan() == 0); /* this program has none */
  const char *lib = getenv("PROTEUS_TEST_FATBINS");
  EXPECT(lib != NULL);
  if (!lib) return;
  pid_t pid = fork();
  if (pid == 0) {
    void *h = dlopen(lib, RTLD_NOW);
    _exit(!h ? 2 : warm_scan() == 1 && warm_scan() == 0 ? 0 : 1); /* found once */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* Given to the driver by its wrapper before the scan (a static cudart, its context made before
   * the prestart thread reads the sections): the same fat binary, not a second one. */
  pid = fork();
  if (pid == 0) {
    void *h = dlopen(lib, RTLD_NOW);
    const void *wrapper = h ? dlsym(h, "fake_wrappers") : NULL;
    if (wrapper) warm_image(wrapper);
    _exit(!wrapper ? 2 : warm_scan() == 0 ? 0 : 1);
  }
  waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A variant's check (check.c): one whose answer asks for a check is held aside, serves no
 * launch until its check; one launch claims the check, others meanwhile run the original and are
 * counted; the outcome publishes it (same; uncheckable by default) or not (differs; uncheckable
 * in full mode); a check put off frees the claim; past the run's budget the original runs. */
static void test_variant_check(void) {
  static kinfo ki;
  atomic_store(&ki.state, K_ACTIVE);
  int saved = g_validate;
  g_validate = VALIDATE_ONCE;
  uint8_t k1[8] = {21}, k2[8] = {22}, k3[8] = {23}, k4[8] = {24}, k5[8] = {25};
  sentry *e = new_entry(&ki, NULL, k1, 8, NULL, 0);
  publish(e, (CUfunction)0xc1, 3, PROTO_IMAGE_CHECK | PROTO_IMAGE_TRIAL);
  EXPECT(atomic_load(&e->fn) == NULL && atomic_load(&e->check) && atomic_load(&e->check)->vid == 2);
  EXPECT(check_pick(&ki, e) == (CUfunction)0xc1 && check_entry == e);
  check_entry = NULL;
  EXPECT(check_pick(&ki, e) == NULL && atomic_load(&ki.awaiting_check) == 2); /* claimed by the first */
  check_done(e, CHECKED_SAME, 1000);
  EXPECT(atomic_load(&e->fn) == (CUfunction)0xc1 && atomic_load(&e->check) == NULL);
  EXPECT(check_pick(&ki, e) == (CUfunction)0xc1 && check_entry == NULL); /* published: a plain hit's function */
  sentry *u = new_entry(&ki, NULL, k2, 8, NULL, 0);
  publish(u, (CUfunction)0xc2, 1, PROTO_IMAGE_CHECK);
  EXPECT(check_pick(&ki, u) == (CUfunction)0xc2);
  check_entry = NULL;
  check_done(u, CHECKED_LATER, 0); /* put off (a stream capture): the next launch claims it */
  EXPECT(check_pick(&ki, u) == (CUfunction)0xc2);
  check_entry = NULL;
  check_done(u, CHECKED_UNCHECKABLE, 0); /* by default it runs unchecked */
  EXPECT(atomic_load(&u->fn) == (CUfunction)0xc2);
  sentry *d = new_entry(&ki, NULL, k3, 8, NULL, 0);
  publish(d, (CUfunction)0xc3, 1, PROTO_IMAGE_CHECK);
  check_pick(&ki, d);
  check_entry = NULL;
  check_done(d, CHECKED_DIFFERS, 0);
  EXPECT(atomic_load(&d->fn) == NULL && atomic_load(&d->check) == NULL);
  g_validate = VALIDATE_FULL; /* uncheckable in full mode: never published */
  sentry *f = new_entry(&ki, NULL, k4, 8, NULL, 0);
  publish(f, (CUfunction)0xc4, 1, PROTO_IMAGE_CHECK);
  check_pick(&ki, f);
  check_entry = NULL;
  check_done(f, CHECKED_UNCHECKABLE, 0);
  EXPECT(atomic_load(&f->fn) == NULL);
  g_validate = VALIDATE_OFF; /* off: published at once, flag or not */
  sentry *o = new_entry(&ki, NULL, k5, 8, NULL, 0);
  publish(o, (CUfunction)0xc5, 1, PROTO_IMAGE_CHECK);
  EXPECT(atomic_load(&o->fn) == (CUfunction)0xc5 && atomic_load(&o->check) == NULL);
  /* compiled in the background (a worker publishes it held, then the entry stops pending): the
   * next launch, through pick_compiling, claims its check */
  g_validate = VALIDATE_ONCE;
  int saved_async = g_async;
  g_async = ASYNC_AUTO;
  sentry *w = new_entry(&ki, NULL, (uint8_t[8]){27}, 8, NULL, 1);
  publish(w, (CUfunction)0xc7, 1, PROTO_IMAGE_CHECK);
  atomic_store(&w->pending, 0);
  EXPECT(pick_compiling(&ki, w, (CUstream)0x5, 0) == (CUfunction)0xc7 && check_entry == w);
  check_entry = NULL;
  g_async = saved_async;
  /* the budget: checks that took far longer than the run's share so far put the next off */
  g_validate = VALIDATE_ONCE;
  atomic_store(&t_loaded_ns, now_ns());
  sentry *b = new_entry(&ki, NULL, (uint8_t[8]){26}, 8, NULL, 0);
  publish(b, (CUfunction)0xc6, 1, PROTO_IMAGE_CHECK);
  check_done(o, CHECKED_LATER, 10ull * 1000000000ull); /* (o has no check: only the time counts) */
  uint64_t waited = atomic_load(&ki.awaiting_check);
  EXPECT(check_pick(&ki, b) == NULL && atomic_load(&ki.awaiting_check) == waited + 1 && check_entry == NULL);
  /* for the report: checks that ended are counted, one put off is not; the budget's time is all
   * of theirs; a phase gets the time since its caller's mark, and the mark moves on */
  EXPECT(atomic_load(&n_checks_made) == 4 && check_spent() == 10ull * 1000000000ull + 1000);
  uint64_t mark = now_ns() - 5000, before = atomic_load(&t_check_phase_ns[CHECK_SHADOW]);
  check_phase(CHECK_SHADOW, &mark);
  EXPECT(atomic_load(&t_check_phase_ns[CHECK_SHADOW]) - before >= 5000 && mark >= now_ns() - 1000000000ull);
  g_validate = saved;
}

int main(void) {
  test_hash();
  test_handles();
  test_keys_and_variants();
  test_last_hit();
  test_policy_race();
  test_async_env();
  test_defer();
  test_exit_drains_the_queue();
  test_await_variant();
  test_gpu_time_samples();
  test_speed_trial();
  test_variant_check();
  test_stream_capture();
  test_graphs();
  test_exit_from_main_times_main();
  test_warm_scan();
  test_warm_start();
  if (failures) {
    fprintf(stderr, "%d failed\n", failures);
    return 1;
  }
  printf("shim unit tests: all passed\n");
  return 0;
}
