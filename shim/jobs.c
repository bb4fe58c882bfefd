/* What happens on a miss, one code for every platform: the kernel resolved, the key built, the
 * variant found, compiled on the launching thread or queued for a compile thread
 * (PROTEUS_ASYNC_COMPILATION), launches kept for the value tracker, waiting for a variant that
 * is compiling, loading an answer's image, and the compiler's warm-up that compiling waits for.
 * What it needs of the GPU it asks of `gpu` (platform.h); Python it asks through python.c. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "hitpath.h"
#include "platform.h"
#include "shim.h"

/* Estimated GPU time the kernel has used so far: mean sampled time x launches. */
double gpu_ms(kinfo *ki) {
  uint64_t n = atomic_load(&ki->samples);
  return n ? (double)atomic_load(&ki->sampled_ns) / (double)n * (double)atomic_load(&ki->launches) / 1e6 : 0.0;
}


job *make_job(kinfo *ki, void *owner, gpu_ctx ctx, void **params, dim3 grid, dim3 block) {
  job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  for (uint32_t i = 0; i < ki->nparams; i++) j->nargs += ki->sizes[i];
  j->args = malloc(j->nargs ? j->nargs : 1);
  j->addrs = calloc(ki->nglobals + 1, sizeof(uint64_t));
  if (!j->args || !j->addrs) {
    free(j->args);
    free(j->addrs);
    free(j);
    return NULL;
  }
  pack_args(ki, params, j->args);
  j->gen = atomic_load(&ki->gen);
  const struct gpu_ops *platform = gpu;
  for (uint32_t i = 0; i < ki->nglobals; i++) j->addrs[i] = platform->global_address(ki, owner, ki->globals[i]);
  j->ki = ki;
  j->ctx = ctx;
  j->grid = grid;
  j->block = block;
  j->gpu_ms = gpu_ms(ki);
  platform->arch(&j->arch);   /* (unknown: the run time refuses it, and the original runs) */
  return j;
}

void free_job(job *j) {
  free(j->args);
  free(j->addrs);
  free(j);
}

/* ---- a kernel's first launch */

/* Which recorded kernel this is: Python is asked (runtime.kernel_info) on the device's
 * architecture; a device the platform cannot name runs the original without asking. jit_lock
 * held. */
void resolve(kinfo *ki) {
  if (atomic_load(&ki->state) != K_UNRESOLVED) return;
  uint8_t *blob = NULL;
  ssize_t n = 0;
  gpu_arch arch = {0, NULL};
  if (gpu->arch(&arch) && python_ready()) blob = py_kernel_info(ki->image, ki->name, arch, &n);
  resolve_with(ki, blob, n);
  free(blob);
}

/* The kernel as runtime.kernel_info answered (NULL: run its original code), in the current
 * context; also from an answer made ahead (a platform's preload). jit_lock held. */
void resolve_with(kinfo *ki, const uint8_t *blob, ssize_t n) {
  int state = K_DISABLED;
  if (read_kernel_info(ki, blob, n)) {
    state = K_ACTIVE;
    gpu->kernel_ready(ki);
  }
  atomic_store(&ki->state, state);
}

/* ---- answers and their images */

__thread uint64_t tl_load_ns;

/* Load the variant of an answer (protocol.h: PROTO_IMAGE_HEAD, the entry point's name, the
 * image) in the current context; *m: which of the kernel's variants it is, and whether to time
 * it first (trial.c). A refused image is reported to the run time, which warns once per kernel;
 * NULL then, and the original runs. The image goes to the platform as a copy of its own: the
 * driver reads an ELF image's headers in place, aligned, and HIP's may read it after loading. */
gpu_fn load_answer(kinfo *ki, const uint8_t *p, size_t n, answer_meta *m) {
  uint32_t nlen;
  if (n < PROTO_IMAGE_HEAD) return NULL;
  memcpy(&nlen, p, 4);
  if (m) {
    memcpy(&m->vid, p + PROTO_IMAGE_VARIANT_AT, 4);
    memcpy(&m->flags, p + PROTO_IMAGE_FLAGS_AT, 4);
  }
  if (n < PROTO_IMAGE_HEAD + (size_t)nlen + 1) return NULL;
  char *name = strndup((const char *)p + PROTO_IMAGE_HEAD, nlen);
  size_t nimage = n - PROTO_IMAGE_HEAD - nlen;
  uint8_t *image = malloc(nimage);
  if (!name || !image) {
    free(name);
    free(image);
    return NULL;
  }
  memcpy(image, p + PROTO_IMAGE_HEAD + nlen, nimage);
  uint64_t t0 = now_ns();
  gpu_fn fn = NULL;
  int error = 200;   /* an invalid image, in CUDA's codes and HIP's alike: what the injected fault answers */
  const char *fault = getenv(ENV_FAULT_INJECT);   /* tests only: see proteus_rewrite/faults.py */
  if (fault && strstr(fault, "module-load")) free(image);
  else fn = gpu->load(ki, image, name, &error);
  if (!fn) py_load_failed(ki->kid, error);
  tl_load_ns += now_ns() - t0;
  free(name);
  return fn;
}

/* What an answer asks of its launch: *changed, the policy changed (the key is stale);
 * *uncached, the variant is in no cache (to compile); or its variant, loaded. */
static gpu_fn take_answer(kinfo *ki, py_answer *a, int *uncached, int *changed, answer_meta *m) {
  gpu_fn fn = NULL;
  if (a->status == PROTO_MISS_POLICY_CHANGED && changed) *changed = 1;
  if (a->status == PROTO_MISS_IMAGE && !a->nimage && uncached) *uncached = 1;
  if (a->status == PROTO_MISS_IMAGE && a->nimage) fn = load_answer(ki, a->image, a->nimage, m);
  free(a->buf);
  return fn;
}

/* Specialize and load one variant, the job's context current. With cached_only, only the
 * caches are asked: *uncached is set when the variant needs compiling. */
gpu_fn run_job(job *j, int cached_only, int *uncached, answer_meta *m) {
  py_answer a;
  py_specialize(j, cached_only, &a, NULL);
  return take_answer(j->ki, &a, uncached, NULL, m);
}


/* ---- the compiler's warm-up, once, from whichever thread comes first (lifecycle.c's prestart
 * thread, a compile thread, or the first compile request; a caller that finds it running waits),
 * counted as the app's wait on an app thread, and only where the platform warms up
 * (gpu_ops.compiler_warm_up). Here, not in lifecycle.c, which calls into this file: a call back
 * would make the two a loop (tests/unit/test_architecture.py). */
pthread_mutex_t pre_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t pre_cond = PTHREAD_COND_INITIALIZER;
int pre_state, compiler_prepared;   /* pre_lock */
int main_wrapped;                   /* lifecycle.c's __libc_start_main runs the app's main: exit is guarded */

void prepare_compiler(int sm, int app_thread) {
  if (!gpu->compiler_warm_up) return;
  pthread_mutex_lock(&pre_lock);
  while (pre_state == PRE_COMPILER) pthread_cond_wait(&pre_cond, &pre_lock);
  int todo = !compiler_prepared;
  compiler_prepared = 1;
  pthread_mutex_unlock(&pre_lock);
  if (!todo) return;
  uint64_t t0 = now_ns();
  py_prepare_compiler(sm);
  if (app_thread) atomic_fetch_add(&t_prepare_ns, now_ns() - t0);
}

/* ---- asynchronous compilation (PROTEUS_ASYNC_COMPILATION): a miss queues a job and runs
 * the original kernel; workers compile and publish the function into the pending entry. */
int g_async = -1, g_async_threads = 1;
pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
job *q_head, *q_tail;
int q_stop, q_busy, q_workers;


void *worker(void *arg) {
  (void)arg;
  const struct gpu_ops *platform = gpu;
  if (platform->thread_init) platform->thread_init();
  for (;;) {
    pthread_mutex_lock(&q_lock);
    while (!q_head && !q_stop) pthread_cond_wait(&q_cond, &q_lock);
    if (q_stop) {
      pthread_mutex_unlock(&q_lock);
      park_for_exit();
    }
    job *j = q_head;
    q_head = j->next;
    if (!q_head) q_tail = NULL;
    q_busy++;
    pthread_mutex_unlock(&q_lock);

    gpu_fn fn = NULL;
    answer_meta meta = {0, 0};
    int compiled = 0;
    uint64_t c0 = thread_cpu_ns();
    py_drain_deferred(j->ki);
    /* A job queued before the tracker changed the kernel's policy has a key no launch makes
     * any more: skip it, so the variant the launches now ask for is not stuck behind it. */
    if (j->gen == atomic_load(&j->ki->gen) && platform->set_context(j->ctx)) {
      compiled = 1;
      prepare_compiler(j->arch.sm, 0);   /* at once once done; see start_workers */
      prof_push("proteus-rewrite compile: %s", j->ki->name ? j->ki->name : "?");
      fn = run_job(j, 0, NULL, &meta);
      prof_pop();
    }
    trial_attach(j->ki, j->e, meta.vid, meta.flags, fn);
    publish(j->e, fn, meta.vid, meta.flags);
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
 * dropped unread; the compile budget bounds the rest). It must run before the GPU runtime
 * tears its context down and before the destructors of LLVM's static objects, which exit also
 * runs and which LLVM registers on first use: a thread still inside LLVM when they run crashes
 * the app (docs/dev/findings/startup-and-exit.md, "Exit waits for the compiler"). Exit
 * handlers run last-registered first, so this is registered after a warm-up compilation
 * (start_workers) and again after every compilation. */
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
    if (n < sizeof a) {
      memcpy(a, raw, n);
      a[n] = 0;
    }
  }
  g_async = !a[0] || !strcasecmp(a, "auto")                                                                  ? ASYNC_AUTO
            : !strcasecmp(a, "1") || !strcasecmp(a, "true") || !strcasecmp(a, "yes") || !strcasecmp(a, "on") ? ASYNC_ON
                                                                                                             : ASYNC_OFF;
  cpu_set_t set;
  g_async_threads =
      compile_threads(t, sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN));
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
  if (!main_wrapped && gpu->compiler_warm_up) {
    gpu_arch arch = {0, NULL};
    gpu->arch(&arch);
    prepare_compiler(arch.sm, 1);
  }
  register_atfork();
  pthread_mutex_lock(&q_lock);
  if (!q_stop && atexit(stop_workers) == 0) {
    for (int i = 0; i < g_async_threads; i++) {
      pthread_t t;
      if (pthread_create(&t, NULL, worker, NULL) == 0) {
        pthread_detach(t);
        q_workers++;
      }
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
  const struct gpu_ops *platform = gpu;
  if (platform->preload) platform->preload->atfork_child();
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
  if (q_stop || !q_workers) {
    pthread_mutex_unlock(&q_lock);
    return 0;
  }
  j->next = NULL;
  if (q_tail) q_tail->next = j;
  else q_head = j;
  q_tail = j;
  atomic_fetch_add(&j->ki->jobs, 1);
  pthread_cond_signal(&q_cond);
  pthread_mutex_unlock(&q_lock);
  return 1;
}


/* A launch whose variant is compiling in the background (PROTEUS_ASYNC_COMPILATION=auto). It
 * waits for it only where waiting costs the GPU nothing: the kernel's previous launch that
 * found no compiled variant asked for this same one, and the stream still has work queued.
 * Once the stream runs dry the original runs, which keeps the GPU busy. So an app that queues
 * many long launches at once gets them specialized, a value that changes on every launch never
 * waits (it never asks twice in a row), and a host-bound loop, whose stream is idle at each
 * launch, never waits either (docs/dev/findings/background-compilation.md). The wait polls the
 * stream, yielding the CPU between queries: a sleep of a short kernel's scale leaves the GPU
 * idle for most of each wait. Not where this thread holds the GIL (a Python app): the compile
 * thread needs it. NULL: run the original.
 *
 * A host-bound loop would ask its idle stream on every launch of the compile window, and those
 * queries add up to a measurable share of its launch time (same findings file, "Stream queries
 * back off"). So after a launch finds the stream idle, the next ones skip the question, 1, 2,
 * 4, ... up to CHECK_GAP_MAX launches; a launch that finds the stream busy ends the skipping.
 * A GPU-bound loop finds it busy at once and never skips; one that turns GPU-bound runs at most
 * CHECK_GAP_MAX more originals. */
#define AWAIT_LIMIT_NS (60ull * 1000000000ull)   /* a compilation takes well under a second */
#define CHECK_GAP_MAX 64
gpu_fn await_variant(kinfo *ki, sentry *e, gpu_stream stream) {
  if (g_async != ASYNC_AUTO) return NULL;
  if (atomic_exchange_explicit(&ki->unserved, e->hash, memory_order_relaxed) != e->hash) return NULL;
  uint32_t skip = atomic_load_explicit(&ki->check_skip, memory_order_relaxed);
  if (skip) {   /* racing threads may skip one more or one less: only how often the stream is asked */
    atomic_store_explicit(&ki->check_skip, skip - 1, memory_order_relaxed);
    return atomic_load_explicit(&e->fn, memory_order_acquire);
  }
  uint64_t t0 = now_ns();
  if (py_holds_gil()) return NULL;
  /* no stream queries while a capture is open anywhere (platform.h: stream_capturing) */
  if (atomic_load_explicit(&captures_open, memory_order_relaxed)) return atomic_load_explicit(&e->fn, memory_order_acquire);
  unsigned rounds = 0;
  int idle = 0;
  const struct gpu_ops *platform = gpu;
  while (atomic_load_explicit(&e->pending, memory_order_acquire) && !__atomic_load_n(&q_stop, __ATOMIC_ACQUIRE)) {
    if (!platform->stream_busy(stream)) {
      idle = 1;
      break;
    }
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
__attribute__((noinline)) gpu_fn pick_compiling(kinfo *ki, sentry *e, gpu_stream stream, int asked_first) {
  gpu_fn fn;
  if (!asked_first) {   /* the launch that asked for it runs the original */
    if ((fn = await_variant(ki, e, stream))) {
      atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
      variant_ran(e);
      return fn;
    }
    if (!atomic_load_explicit(&e->pending, memory_order_acquire)) {
      if (atomic_load_explicit(&e->check, memory_order_acquire)) return check_pick(ki, e);
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
 * job (py_drain_deferred) or with the kernel's next miss that calls Python, whichever comes
 * first. A policy it changes makes its job stale, dropped unread. That is a step counter's
 * learning: T + 2 misses, each a Python call on the launching thread, become two: the miss that
 * passes them on, whose key the policy they change makes stale, and that launch's key built
 * anew (docs/dev/findings/value-tracker.md, "Why a miss should not call Python"). Not past
 * defer_max records, after which a miss calls Python as before. Not in synchronous mode
 * (nothing is queued there). jit_lock held. */
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
gpu_fn miss_variant(const void *handle, void **params, dim3 grid, dim3 block, kinfo *ki, gpu_ctx ctx, sentry **served_out,
                    sentry **compiling_out, int *asked_first_out) {
  uint8_t key[MAX_KEY];
  int len;
  gpu_fn fn = NULL;
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
  const struct gpu_ops *platform = gpu;
  if (atomic_load(&ki->state) == K_UNRESOLVED && platform->preload) platform->preload->resolve(ki, ctx);
  if (atomic_load(&ki->state) == K_UNRESOLVED) resolve(ki);
  stage(MISS_RESOLVE, &t);
  if (!params && ki->nparams) goto done;   /* launched through `extra` */
  gpu_ctx kctx = ki->ctx_free ? NULL : ctx;   /* the context in the key: none for a context-free kernel */
  /* The tracker sees the launch in the same call that asks the caches (py_miss); where it
   * changes the kernel's policy, the key is built again under the new one and asked for alone. */
  int tracked = 0;
again:;
  uint32_t gen = atomic_load(&ki->gen);   /* stable: changed only under jit_lock */
  int active = atomic_load(&ki->state) == K_ACTIVE;
  len = active ? build_key(ki, params, grid, block, key, gen) : -1;
  if (active && len < 0 && !tracked) {   /* a key too long: the tracker may yet stop folding what makes it so */
    py_track(ki, params, grid, block);
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
        uint64_t load0 = tl_load_ns;
        py_answer a;
        if (tracked) py_specialize(j, background, &a, &t);
        else py_miss(j, background, &a, &t);
        uint64_t track_ns = a.track_ns;
        fn = take_answer(ki, &a, &uncached, &changed, &meta);
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
          fn = run_job(j, 0, NULL, &meta);
        }
      }
      if (j) {
        free_job(j);
        sentry *ne = new_entry(ki, kctx, key, len, NULL, 0);
        if (ne) {
          trial_attach(ki, ne, meta.vid, meta.flags, fn);
          publish(ne, fn, meta.vid, meta.flags);
          fn = atomic_load(&ne->fn);   /* NULL while it waits for its check */
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
__attribute__((noinline, cold)) gpu_fn pick_miss(const void *handle, void **params, dim3 grid, dim3 block, gpu_stream stream,
                                                 kinfo *ki, gpu_ctx ctx, int ctx_free) {
  const struct gpu_ops *platform = gpu;
  if (ctx_free && (!platform->current_context(&ctx) || !ctx)) goto original;
  if (platform->stream_capturing(stream) > 0) {   /* into a graph: the original, and nothing that could end the capture */
    atomic_fetch_add_explicit(&ki->captured, 1, memory_order_relaxed);
    return NULL;
  }
  sentry *served, *compiling;
  int asked_first;
  gpu_fn fn = miss_variant(handle, params, grid, block, ki, ctx, &served, &compiling, &asked_first);
  if (fn) {
    if (served) variant_ran(served);
    return fn;
  }
  if (served && atomic_load_explicit(&served->check, memory_order_acquire)) return check_pick(ki, served);
  if (compiling) return pick_compiling(ki, compiling, stream, asked_first);
original:
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
  return NULL;
}
