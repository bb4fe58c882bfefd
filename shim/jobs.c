/* What happens on a miss: the kernel resolved, the key built, the variant found, compiled on
 * the launching thread or queued for a compile thread (PROTEUS_ASYNC_COMPILATION), launches
 * kept for the value tracker, and waiting for a variant that is compiling. */
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

#include "cuda_api.h"
#include "hitpath.h"
#include "shim.h"

/* Estimated GPU time the kernel has used so far: mean sampled time x launches. */
double gpu_ms(kinfo *ki) {
  uint64_t n = atomic_load(&ki->samples);
  return n ? (double)atomic_load(&ki->sampled_ns) / (double)n * (double)atomic_load(&ki->launches) / 1e6 : 0.0;
}


job *make_job(kinfo *ki, void *owner, CUcontext ctx, void **params, dim3 grid, dim3 block) {
  job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  for (uint32_t i = 0; i < ki->nparams; i++) j->nargs += ki->sizes[i];
  j->args = malloc(j->nargs ? j->nargs : 1);
  j->addrs = calloc(ki->nglobals + 1, sizeof(uint64_t));
  if (!j->args || !j->addrs) { free(j->args); free(j->addrs); free(j); return NULL; }
  pack_args(ki, params, j->args);
  j->gen = atomic_load(&ki->gen);
  for (uint32_t i = 0; i < ki->nglobals; i++) j->addrs[i] = global_address(ki, owner, ki->globals[i]);
  j->ki = ki; j->ctx = ctx; j->grid = grid; j->block = block; j->gpu_ms = gpu_ms(ki); j->arch = current_arch();
  return j;
}

void free_job(job *j) { free(j->args); free(j->addrs); free(j); }


/* ---- asynchronous compilation (PROTEUS_ASYNC_COMPILATION): a miss queues a job and runs
 * the original kernel; workers compile and publish the function into the pending entry. */
int g_async = -1, g_async_threads = 1;
pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
job *q_head, *q_tail;
int q_stop, q_busy, q_workers;


/* pass_deferred on a compile thread before it takes a job: one of the launches may make that
 * job stale. The GIL first, then jit_lock only if it is free: a Python app's launching thread holds the GIL when it waits for
 * jit_lock, so waiting for the GIL while holding jit_lock could deadlock. Where jit_lock stays
 * taken, the launches wait for the next drain or miss (the job then reads an older policy). */
static void drain_deferred(kinfo *ki) {
  for (int tries = 0; tries < 8 && atomic_load_explicit(&ki->ndeferred, memory_order_relaxed); tries++) {
    int g = py.GILStateEnsure();
    int locked = pthread_mutex_trylock(&jit_lock) == 0;
    if (locked) {
      pass_deferred(ki);
      pthread_mutex_unlock(&jit_lock);
    }
    py.GILStateRelease(g);
    if (locked) return;
    sched_yield();
  }
}

void *worker(void *arg) {
  (void)arg;
  relax_capture_mode();
  for (;;) {
    pthread_mutex_lock(&q_lock);
    while (!q_head && !q_stop) pthread_cond_wait(&q_cond, &q_lock);
    if (q_stop) { pthread_mutex_unlock(&q_lock); return NULL; }
    job *j = q_head;
    q_head = j->next;
    if (!q_head) q_tail = NULL;
    q_busy++;
    pthread_mutex_unlock(&q_lock);

    CUfunction fn = NULL;
    answer_meta meta = {0, 0};
    int compiled = 0;
    uint64_t c0 = thread_cpu_ns();
    drain_deferred(j->ki);
    /* A job queued before the tracker changed the kernel's policy has a key no launch makes
     * any more: skip it, so the variant the launches now ask for is not stuck behind it. */
    if (j->gen == atomic_load(&j->ki->gen) && real_cuCtxSetCurrent(j->ctx) == CUDA_SUCCESS) {
      compiled = 1;
      prepare_compiler(j->arch, 0);   /* at once once done; see start_workers */
      prof_push("proteus-rewrite compile: %s", j->ki->name ? j->ki->name : "?");
      int g = py.GILStateEnsure();
      fn = run_job(j, 0, NULL, &meta);
      py.GILStateRelease(g);
      prof_pop();
    }
    trial_attach(j->ki, j->e, meta.vid, meta.flags, fn);
    atomic_store_explicit(&j->e->fn, fn, memory_order_release);
    atomic_store_explicit(&j->e->pending, 0, memory_order_release);
    atomic_fetch_sub(&j->ki->jobs, 1);
    free_job(j);
    atomic_fetch_add(&t_worker_cpu_ns, thread_cpu_ns() - c0);

    pthread_mutex_lock(&q_lock);
    if (compiled && !q_stop) atexit(stop_workers);   /* after whatever that compilation made first */
    q_busy--;
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_lock);
  }
}

/* At exit: let the compile threads finish what is queued, then stop them. The variants go to
 * the disk cache, so the next run starts warm, as after compiling each on the launching
 * thread; the app pays at exit what that mode pays during the run, and no more (stale jobs are
 * dropped unread; the compile budget bounds the rest). It must run before the CUDA runtime
 * tears its context down and before the destructors of LLVM's static objects, which exit also
 * runs and which LLVM registers on first use: a worker still inside LLVM when they ran crashed
 * the app (H100, 2026-11-23). Exit handlers run last-registered first, so this is registered
 * after a warm-up compilation (start_workers) and again after every compilation. */
#define EXIT_LIMIT_S 60   /* past this, queued jobs are dropped and their launches were originals */
void stop_workers(void) {
  pthread_mutex_lock(&q_lock);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += EXIT_LIMIT_S;
  uint64_t t0 = now_ns();
  int waited = q_head || q_busy;
  while (!q_stop && q_workers && (q_head || q_busy) && pthread_cond_timedwait(&q_cond, &q_lock, &until) == 0) {}
  __atomic_store_n(&q_stop, 1, __ATOMIC_RELEASE);   /* also read, unlocked, by await_variant */
  while (q_head) {   /* only past the limit, or with no compile thread */
    job *j = q_head;
    q_head = j->next;
    atomic_store_explicit(&j->e->pending, 0, memory_order_release);
    atomic_fetch_sub(&j->ki->jobs, 1);
    free_job(j);
  }
  q_tail = NULL;
  pthread_cond_broadcast(&q_cond);
  while (q_busy && pthread_cond_timedwait(&q_cond, &q_lock, &until) == 0) {}
  if (waited) atomic_fetch_add(&t_exit_wait_ns, now_ns() - t0);
  pthread_mutex_unlock(&q_lock);
}

/* PROTEUS_ASYNC_THREADS, as config.py reads it (which refuses what is neither auto nor 1 to the
 * max), on a process that may run on `cpus` CPUs */
int compile_threads(const char *t, long cpus) {
  while (t && (*t == ' ' || *t == '\t')) t++;
  if (t && *t && strncasecmp(t, "auto", 4)) {
    int n = atoi(t);
    return n < 1 ? 1 : n > MAX_COMPILE_THREADS ? MAX_COMPILE_THREADS : n;
  }
  long n = cpus / CPUS_PER_COMPILE_THREAD;
  return n < 1 ? 1 : n > AUTO_COMPILE_THREADS_MAX ? AUTO_COMPILE_THREADS_MAX : (int)n;
}

void read_async_env(void) {   /* jit_lock held */
  if (g_async >= 0) return;
  const char *raw = getenv(ENV_ASYNC_COMPILATION), *t = getenv(ENV_ASYNC_THREADS);
  char a[16] = "";   /* as config.py reads it (which refuses anything else): blanks around ignored */
  if (raw) {
    while (*raw == ' ' || *raw == '\t') raw++;
    size_t n = strcspn(raw, " \t");
    if (n < sizeof a) { memcpy(a, raw, n); a[n] = 0; }
  }
  g_async = !a[0] || !strcasecmp(a, "auto") ? ASYNC_AUTO
            : !strcasecmp(a, "1") || !strcasecmp(a, "true") || !strcasecmp(a, "yes") || !strcasecmp(a, "on") ? ASYNC_ON
            : ASYNC_OFF;
  cpu_set_t set;
  g_async_threads = compile_threads(t, sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                                 : sysconf(_SC_NPROCESSORS_ONLN));
}

/* The first queued job starts the compile threads. The compiler's first use (about 0.2 s, or
 * what is left of the prestart thread's) must come before stop_workers is registered, so that
 * its exit-time destructors run after it: where the shim guards exit (before_exit runs
 * stop_workers ahead of every exit handler), a compile thread does it, and the app's thread
 * goes on at once; elsewhere it is done here, on the app's thread. */
static void start_workers(void) {   /* jit_lock held */
  static int tried;
  if (tried) return;
  tried = 1;
  if (!main_wrapped) prepare_compiler(current_arch(), 1);
  register_atfork();
  pthread_mutex_lock(&q_lock);
  if (!q_stop && atexit(stop_workers) == 0) {
    for (int i = 0; i < g_async_threads; i++) {
      pthread_t t;
      if (pthread_create(&t, NULL, worker, NULL) == 0) { pthread_detach(t); q_workers++; }
    }
  }
  pthread_mutex_unlock(&q_lock);
}

/* fork: the child has none of the shim's threads, and a lock one of them held stays held.
 * Compile threads: none in the child (a later miss compiles on its own thread), so the
 * variants the parent was compiling never arrive: the child runs the original for them rather
 * than wait. The prestart thread: an interpreter half started, so the child runs original kernels. */
static void atfork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
  q_lock = fresh;
  q_cond = fresh_cond;
  q_head = q_tail = NULL;
  q_busy = q_workers = 0;
  for (kinfo *k = all_kernels; k; k = k->next_all) atomic_store_explicit(&k->jobs, 0, memory_order_relaxed);
  for (uint32_t i = 0; i < SSLOTS; i++) {
    sentry *e = atomic_load_explicit(&variants[i], memory_order_relaxed);
    if (e) atomic_store_explicit(&e->pending, 0, memory_order_relaxed);
  }
  warm_atfork_child();
  if (pre_state == PRE_PYTHON || pre_state == PRE_COMPILER) {
    pthread_mutex_t fresh_jit = PTHREAD_MUTEX_INITIALIZER, fresh_pre = PTHREAD_MUTEX_INITIALIZER;
    jit_lock = fresh_jit;
    pre_lock = fresh_pre;
    py_state = -1;
    pre_state = PRE_DONE;
  }
}

void register_atfork(void) {
  static _Atomic int once;
  if (!atomic_exchange(&once, 1)) pthread_atfork(NULL, NULL, atfork_child);
}

static int enqueue(job *j) {   /* jit_lock held */
  start_workers();
  pthread_mutex_lock(&q_lock);
  if (q_stop || !q_workers) { pthread_mutex_unlock(&q_lock); return 0; }
  j->next = NULL;
  if (q_tail) q_tail->next = j; else q_head = j;
  q_tail = j;
  atomic_fetch_add(&j->ki->jobs, 1);
  pthread_cond_signal(&q_cond);
  pthread_mutex_unlock(&q_lock);
  return 1;
}


/* Whether the GPU still has work queued on the stream (a capturing stream says no: a query
 * would end the capture). */
static int stream_busy(CUstream s) {
  int capturing = 1;
  return real_cuStreamQuery && real_cuStreamIsCapturing && real_cuStreamIsCapturing(s, &capturing) == CUDA_SUCCESS &&
         !capturing && real_cuStreamQuery(s) == 600 /* CUDA_ERROR_NOT_READY */;
}


/* A launch whose variant is compiling in the background (PROTEUS_ASYNC_COMPILATION=auto). It
 * waits for it only where waiting costs the GPU nothing: the kernel's previous launch that
 * found no compiled variant asked for this same one, and the stream still has work queued.
 * Once the stream runs dry the original runs, which keeps the GPU busy. So an app that queues
 * many long launches at once gets them specialized (rsbench ran its 51 launches while its one
 * variant compiled, 0.99x of native, against 1.15x compiling on the launching thread), a value
 * that changes on every launch never waits (it never asks twice in a row), and a host-bound
 * loop, whose stream is idle at each launch, never waits either. The wait polls the stream
 * (yielding the CPU between queries): a sleep of the kernel's scale left the GPU idle for
 * most of each wait (H100: 74 waits of 0.27 ms on 85 us kernels with 0.2 ms sleeps). Not where
 * this thread holds the GIL (a Python app): the compile thread needs it. NULL: run the original.
 *
 * A host-bound loop would ask its idle stream on every launch of the compile window (about
 * 1,100 launches of a step counter's general variant on the H100, each query under 2 us, and more
 * launch time besides: 10 ms over a warm run's launch calls). So after a launch finds the
 * stream idle, the next ones skip the question, 1, 2, 4, ... up to CHECK_GAP_MAX launches; a
 * launch that finds the stream busy ends the skipping. A GPU-bound loop finds it busy at once
 * and never skips; one that turns GPU-bound runs at most CHECK_GAP_MAX more originals. */
#define AWAIT_LIMIT_NS (60ull * 1000000000ull)   /* a compilation takes well under a second */
#define CHECK_GAP_MAX 64
CUfunction await_variant(kinfo *ki, sentry *e, CUstream stream) {
  if (g_async != ASYNC_AUTO) return NULL;
  if (atomic_exchange_explicit(&ki->unserved, e->hash, memory_order_relaxed) != e->hash) return NULL;
  uint32_t skip = atomic_load_explicit(&ki->check_skip, memory_order_relaxed);
  if (skip) {   /* racing threads may skip one more or one less: only how often the stream is asked */
    atomic_store_explicit(&ki->check_skip, skip - 1, memory_order_relaxed);
    return atomic_load_explicit(&e->fn, memory_order_acquire);
  }
  uint64_t t0 = now_ns();
  if (py.GILStateCheck && py.GILStateCheck()) return NULL;
  /* no stream queries while a capture is open anywhere (cuda_capture.c) */
  if (atomic_load_explicit(&captures_open, memory_order_relaxed)) return atomic_load_explicit(&e->fn, memory_order_acquire);
  unsigned rounds = 0;
  int idle = 0;
  while (atomic_load_explicit(&e->pending, memory_order_acquire) && !__atomic_load_n(&q_stop, __ATOMIC_ACQUIRE)) {
    if (!stream_busy(stream)) { idle = 1; break; }
    if (++rounds % 256 == 0 && now_ns() - t0 > AWAIT_LIMIT_NS) break;
    sched_yield();
  }
  if (rounds) {
    atomic_store_explicit(&ki->check_gap, 0, memory_order_relaxed);
    atomic_fetch_add(&t_await_ns, now_ns() - t0);
    atomic_fetch_add(&n_awaits, 1);
  } else {   /* asked the stream and found it idle: what that costs a host-bound loop */
    if (idle) {
      uint32_t gap = atomic_load_explicit(&ki->check_gap, memory_order_relaxed);
      gap = gap ? (gap * 2 > CHECK_GAP_MAX ? CHECK_GAP_MAX : gap * 2) : 1;
      atomic_store_explicit(&ki->check_gap, gap, memory_order_relaxed);
      atomic_store_explicit(&ki->check_skip, gap, memory_order_relaxed);
    }
    atomic_fetch_add(&t_check_ns, now_ns() - t0);
    atomic_fetch_add(&n_checks, 1);
  }
  return atomic_load_explicit(&e->fn, memory_order_acquire);
}

/* A launch whose variant is compiling in the background: wait for it where that is free
 * (await_variant), else run the original and count it. */
__attribute__((noinline)) CUfunction pick_compiling(kinfo *ki, sentry *e, CUstream stream, int asked_first) {
  CUfunction fn;
  if (!asked_first) {   /* the launch that asked for it runs the original */
    if ((fn = await_variant(ki, e, stream))) {
      atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
      variant_ran(e);
      return fn;
    }
    if (!atomic_load_explicit(&e->pending, memory_order_acquire)) {
      atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
      return NULL;
    }
  }
  atomic_fetch_add_explicit(&ki->pending_launches, 1, memory_order_relaxed);
  return NULL;
}


/* A launch with a new key while a variant of its kernel is queued or compiling: its variant
 * is queued without a call into Python (the compile thread asks the caches), and the launch is
 * kept for the value tracker, which sees it, in order, before the compile thread takes the next
 * job (drain_deferred) or with the kernel's next miss that calls Python, whichever comes first.
 * A policy it changes makes its job stale, dropped unread. That is a step counter's learning:
 * T + 2 misses, each a Python call on the launching thread (0.3 ms in the app on the H100 host,
 * cache-cold, against 0.12 ms alone), now two: the miss that passes them on, whose key the
 * policy they change makes stale, and that launch's key built anew. Not past defer_max records,
 * after which a miss calls Python as before. Not in synchronous mode (nothing is queued there). jit_lock held. */
int defer(kinfo *ki, void **params, dim3 grid, dim3 block) {
  if (g_async == ASYNC_OFF || ki->ndeferred >= ki->defer_max || !atomic_load(&ki->jobs)) return 0;
  size_t size = PROTO_DEFER_HEAD + pack_args(ki, NULL, NULL);
  if (!ki->deferred && !(ki->deferred = malloc(size * ki->defer_max))) return 0;
  uint8_t *r = ki->deferred + size * ki->ndeferred++;
  uint32_t dims[6] = {grid.x, grid.y, grid.z, block.x, block.y, block.z};
  memcpy(r, dims, PROTO_DEFER_HEAD);
  pack_args(ki, params, r + PROTO_DEFER_HEAD);
  atomic_fetch_add(&n_deferred, 1);
  return 1;
}

/* The variant for one launch's (or one graph node's) arguments, on a miss: the kernel resolved
 * (first launch), the key built, the caches asked, the variant compiled here or queued for a
 * compile thread. Answers its function, or NULL: then *compiling is its entry where it is being
 * compiled (*asked_first: queued by this call). Counts no launch: the callers do. */
CUfunction miss_variant(const void *handle, void **params, dim3 grid, dim3 block, kinfo *ki, CUcontext ctx,
                        sentry **served_out, sentry **compiling_out, int *asked_first_out) {
  uint8_t key[MAX_KEY];
  int len;
  CUfunction fn = NULL;
  answer_meta meta = {0, 0};
  sentry *compiling = NULL, *served = NULL;
  job *j = NULL;
  int asked_first = 0;
  uint64_t t0 = now_ns(), t = t0;
  prof_push("proteus-rewrite miss: %s", ki->name ? ki->name : "?");
  pthread_mutex_lock(&jit_lock);
  stage(MISS_LOCK, &t);
  trial_release();
  read_async_env();
  if (atomic_load(&ki->state) == K_UNRESOLVED) warm_resolve(ki, ctx);
  if (atomic_load(&ki->state) == K_UNRESOLVED) resolve(ki);
  stage(MISS_RESOLVE, &t);
  if (!params && ki->nparams) goto done;   /* launched through `extra` */
  CUcontext kctx = ki->ctx_free ? NULL : ctx;   /* the context in the key: none for a context-free kernel */
  /* The tracker sees the launch in the same call that asks the caches (miss_job); where it
   * changes the kernel's policy, the key is built again under the new one and asked for alone. */
  int tracked = 0;
again:;
  uint32_t gen = atomic_load(&ki->gen);   /* stable: changed only under jit_lock */
  int active = atomic_load(&ki->state) == K_ACTIVE;
  len = active ? build_key(ki, params, grid, block, key, gen) : -1;
  if (active && len < 0 && !tracked) {   /* a key too long: the tracker may yet stop folding what makes it so */
    track(ki, params, grid, block);
    tracked = 1;
    goto again;
  }
  if (len >= 0) {
    sentry *e = find_variant(ki, kctx, key, len);   /* compiled or queued meanwhile? */
    if (e) {
      fn = atomic_load(&e->fn);
      served = e;
      if (!fn && atomic_load(&e->pending)) compiling = e;
    } else if ((j = make_job(ki, handle_owner(handle), ctx, params, grid, block))) {
      /* Where it compiles: here with PROTEUS_ASYNC_COMPILATION=0, as upstream's default does;
       * otherwise on a compile thread while the original runs (auto: later launches that ask
       * for it again wait for it, await_variant). A variant the caches hold loads here at once,
       * but for a deferred launch: queued unasked, the compile thread asks the caches. */
      int background = g_async != ASYNC_OFF, uncached = 0, changed = 0;
      if (!tracked && defer(ki, params, grid, block)) {
        uncached = 1;
      } else {
        uint64_t track_ns = 0, load0 = tl_load_ns;
        int g = py.GILStateEnsure();
        stage(MISS_GIL, &t);
        fn = tracked ? run_job(j, background, &uncached, &meta) : miss_job(j, background, &uncached, &changed, &track_ns, &meta);
        py.GILStateRelease(g);
        uint64_t call_start = t;
        t = now_ns();   /* the call's time: the tracker's share, then the caches' (or a compilation's) */
        uint64_t load_ns = tl_load_ns - load0;
        if (track_ns + load_ns > t - call_start) track_ns = t - call_start - load_ns;
        atomic_fetch_add_explicit(&t_stage_ns[MISS_TRACK], track_ns, memory_order_relaxed);
        atomic_fetch_add_explicit(&t_stage_ns[MISS_SPECIALIZE], t - call_start - track_ns - load_ns, memory_order_relaxed);
        atomic_fetch_add_explicit(&t_stage_ns[MISS_LOAD], load_ns, memory_order_relaxed);
        tracked = 1;
        if (changed) {
          free_job(j);
          j = NULL;
          goto again;
        }
      }
      if (uncached) {   /* queue it; with no compile thread (exiting, none could start), compile here */
        sentry *ne = new_entry(ki, kctx, key, len, NULL, 1);
        int ok = ne && (j->e = ne) && enqueue(j);
        stage(MISS_QUEUE, &t);
        if (ok) {
          variant_insert(ne);
          atomic_store_explicit(&ki->unserved, ne->hash, memory_order_relaxed);
          compiling = ne;
          asked_first = 1;
          j = NULL;
        } else {
          free(ne);
          int g = py.GILStateEnsure();
          fn = run_job(j, 0, NULL, &meta);
          py.GILStateRelease(g);
        }
      }
      if (j) {
        free_job(j);
        sentry *ne = new_entry(ki, kctx, key, len, fn, 0);
        if (ne) {
          trial_attach(ki, ne, meta.vid, meta.flags, fn);
          variant_insert(ne);
          served = ne;
        }
      }
    }
  }
done:
  pthread_mutex_unlock(&jit_lock);
  prof_pop();
  atomic_fetch_add(&t_miss_ns, now_ns() - t0);
  atomic_fetch_add(&n_misses, 1);
  *served_out = served;
  *compiling_out = compiling;
  *asked_first_out = asked_first;
  return fn;
}

/* Miss: the variant found, compiled or queued (miss_variant), and the launch counted. */
__attribute__((noinline, cold)) CUfunction pick_miss(const void *handle, void **params, dim3 grid, dim3 block,
                                                            CUstream stream, kinfo *ki, CUcontext ctx, int ctx_free) {
  if (ctx_free && (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) goto original;
  if (stream_capturing(stream)) {   /* into a graph: the original, and nothing that could end the capture (cuda_capture.c) */
    atomic_fetch_add_explicit(&ki->captured, 1, memory_order_relaxed);
    return NULL;
  }
  sentry *served, *compiling;
  int asked_first;
  CUfunction fn = miss_variant(handle, params, grid, block, ki, ctx, &served, &compiling, &asked_first);
  if (fn) {
    if (served) variant_ran(served);
    return fn;
  }
  if (compiling) return pick_compiling(ki, compiling, stream, asked_first);
original:
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
  return NULL;
}
