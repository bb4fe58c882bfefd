/* What the translation units of libproteus.so share, layer by layer (tests/shim/test_layers.py
 * holds the order; a file uses only what its own layer or a lower one defines):
 *
 *   0  tables.c (tables.h)   handles, images, variants, counters, clocks; nvtx.c: NVTX ranges
 *      hitpath.h             the hit path, inlined into every launch wrapper
 *   1  python.c              the embedded interpreter: the one file that calls Python
 *   2  trial.c, check.c      speed trials; a new variant's check before it serves
 *   3  jobs.c, lifecycle.c   the miss path and compile threads; start-up, exit, the report
 *   4  the platforms         cuda*.c (cuda_api.h), hip.c (hip_api.h), each filling platform.h's
 *                            `struct gpu_ops`, through which alone the core reaches a GPU
 *
 * Everything declared here has hidden visibility: internal to the shim, never exported to the
 * app (the interposed entry points are marked EXPORT where they are defined). No CUDA or HIP
 * headers, and no CUDA or HIP types in the core: a platform's handles are opaque pointers to it.
 * What crosses into Python is laid out in protocol.h, generated from
 * proteus_rewrite/runtime/protocol.py. */
#ifndef PROTEUS_SHIM_H
#define PROTEUS_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/types.h>

#include "protocol.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))
/* Code that runs inside a sanitizer's own start-up: AddressSanitizer looks its interceptors up
 * through dlsym, which the shim interposes, before its shadow memory exists, so an instrumented
 * access there faults (the sanitizer build of bench/crash_hunt.py) */
#define EARLY __attribute__((no_sanitize_address))

/* A platform's handles, opaque to the core: a loaded kernel function (CUDA: a CUfunction, or a
 * CUkernel for a context-free variant; HIP: a hipFunction_t), a context (CUDA: a CUcontext;
 * HIP: the device's ordinal + 1, so that NULL stays "none"), a stream. */
typedef void *gpu_fn, *gpu_ctx, *gpu_stream;
typedef struct {
  unsigned x, y, z;
} dim3;   /* as CUDA and HIP both lay it out */
/* The device a variant is compiled for: CUDA names it by SM version (0: unknown), HIP by its
 * processor (gcnArchName, "gfx90a:sramecc+:xnack-"; NULL on CUDA). The run time takes either. */
typedef struct {
  int sm;
  const char *name;
} gpu_arch;
struct gpu_ops;   /* platform.h */

#define MAX_PARAMS 256
#define MAX_KEY 4096
#define MAX_ATTRS 16

/* ------------------------------------------------------------------ kernels and handles */

/* Who owns a kernel's handle, which says how its device variables are found. */
enum { OWNER_NONE, OWNER_MODULE, OWNER_LIBRARY, OWNER_RUNTIME, OWNER_HIP_RUNTIME, OWNER_HIP_MODULE };
enum { K_UNRESOLVED, K_ACTIVE, K_DISABLED };
enum { SAMPLE_IDLE, SAMPLE_RECORDING, SAMPLE_PENDING, SAMPLE_OFF };

struct sentry;

/* A hit reads this in the app's launch call, between the driver's work for the previous launch
 * and the app's own, which push it out of the near caches: each line it touches and each
 * pointer it follows cost a cache miss then (docs/dev/findings/hit-path.md, "A hit is bound by
 * cache misses, so the layout matters"). So what a hit reads comes first, in one line, and the hit
 * follows at most three pointers: the handle's slot, this, and the variant (`last`, or the
 * table's). */
typedef struct __attribute__((aligned(64))) kinfo {
  _Atomic int state;
  /* Its variants serve every context (CUDA): loaded as libraries and launched by their
   * CUkernel, they are keyed without the context, so a hit asks the driver nothing: asking it
   * for the context is a measurable share of a launch (docs/dev/findings/hit-path.md, "Context-free
   * variants through cuLibraryLoadData"). Not for a kernel whose variants hold a context's
   * device-variable addresses, nor across GPUs of different architectures. Set by the
   * platform's kernel_ready, before `state` turns K_ACTIVE. */
  int ctx_free;
  uint32_t nparams;
  /* What the key holds: folded arguments (fold), block (bit 0) and grid (bit 1). The value
   * tracker may fold less later; `gen` is a sequence lock around such a change (odd while it
   * happens), so the lock-free hit path never builds a key from half of an old and half of a
   * new policy. */
  _Atomic uint32_t gen;
  _Atomic uint32_t dims_in_key;
  _Atomic int sample_state;   /* SAMPLE_*: GPU time, sampled with a pair of events on a few launches */
  /* The variant the latest hit found: a launch with the same key takes it without hashing
   * or probing the table. Entries are never freed, so it is always safe to read. */
  _Atomic(struct sentry *) last;
  _Atomic uint64_t launches, hits, fallbacks, samples;
  _Atomic uint8_t fold[MAX_PARAMS];
  uint32_t sizes[MAX_PARAMS];
  int kid;                 /* Python's id for the recorded kernel */
  const void *image;       /* fat binary / cubin / offload bundle / code object the kernel came from */
  char *name;
  int owner_kind;
  void *owner;             /* CUmodule, CUlibrary, the runtime's fat binary handle, or HIP's */
  uint32_t nglobals;
  char **globals;
  _Atomic uint64_t launch_errors, pending_launches;
  _Atomic uint64_t captured;   /* launches into a stream capture: the original, always (stream_capturing) */
  /* The hash of the latest launch that found its variant not compiled yet: a launch that asks
   * for the same one again waits for it (PROTEUS_ASYNC_COMPILATION=auto). */
  _Atomic uint64_t unserved;
  /* After a launch found its stream idle, the next `check_skip` launches asking again run the
   * original without asking the stream; the gap doubles up to a cap, and goes back to none
   * when a launch finds the stream busy (see await_variant). */
  _Atomic uint32_t check_skip, check_gap;
  void *ev[2];
  gpu_ctx ev_ctx;   /* where the sample events were made */
  _Atomic uint64_t sampled_ns;
  struct kinfo *next_all;
  /* Launches with a new key handed to the value tracker later (defer()), under jit_lock: at most
   * defer_max (from kernel_info: T + 2 with the tracker, else 0) records of DEFER_HEAD + the
   * arguments' bytes each. `jobs`: its variants queued or compiling. */
  _Atomic uint32_t jobs, ndeferred;   /* ndeferred: written under jit_lock; read unlocked as a hint */
  uint32_t defer_max;
  uint8_t *deferred;
  /* Function attributes the app set on the kernel (cuda_attrs.c): every variant gets them too,
   * when it loads and when the app sets one later. Written under attr_lock. */
  struct {
    int attrib, value, dev;
  } attrs[MAX_ATTRS];
  int nattrs;
  _Atomic uint64_t timing;   /* launches that ran the original to time a variant against it */
  _Atomic uint64_t graph_nodes;   /* kernel nodes of instantiated graphs pointed at a variant (cuda_graph.c) */
  _Atomic uint64_t awaiting_check;   /* launches that ran the original while their variant waited for, or had, its check */
  /* Why its variants cannot be checked, asked of the run time once (its module, not a launch,
   * decides): NULL not asked yet, "" they can be. Asking takes the GIL, which a compile thread
   * may hold for a while. */
  _Atomic(char *) check_refusal;
} kinfo;
_Static_assert(offsetof(kinfo, fold) == 64, "a hit's scalars share the first cache line");

typedef struct sentry {
  uint64_t hash;
  kinfo *ki;
  gpu_ctx ctx;             /* CUDA: the context; HIP: the device (its ordinal + 1) */
  _Atomic(gpu_fn) fn;      /* NULL: failed, or still compiling in the background: run the original */
  _Atomic int pending;
  uint32_t keylen;
  /* What the shim follows of it while it does (trial.c: its speed trial, or its launches for
   * upstream's cache-stats lines): a hit that finds it set goes out of line. */
  _Atomic(struct trial *) trial;
  /* A variant waiting for its check (check.c): its function is published (fn) only once its
   * first launch's results matched the original's; until then launches of its key go out of
   * line, as a miss does. NULL: none. */
  _Atomic(struct vcheck *) check;
  uint8_t key[];
} sentry;

/* ------------------------------------------------------------------ a variant under speed trial (trial.c) */

/* TRIAL_RUNS, TRIAL_MARGIN, TRIAL_FLOOR_MS, TRIAL_LONG_MS: protocol.h (runtime/protocol.py) */
#define TRIAL_TURNS (2 * TRIAL_RUNS)
enum {
  TRIAL_RUNNING = PROTO_TRIAL_UNDECIDED,
  TRIAL_KEPT = PROTO_TRIAL_KEPT,
  TRIAL_SLOWER = PROTO_TRIAL_SLOWER,
  TRIAL_ENDED
};   /* ENDED: no verdict (turns lost to a capture or another context); the variant stays */
enum { TURN_FREE, TURN_RECORDED, TURN_FAILED };
typedef struct trial {
  struct trial *next;
  struct trial *next_spent;   /* decided, its events not yet freed (trial.c trial_release) */
  kinfo *ki;
  struct sentry *e;
  uint32_t vid;            /* the variant's index in the kernel's report */
  int timed_trial;         /* a speed trial (else only its launches are counted) */
  _Atomic int verdict;
  int original_first;      /* its first turn runs the original (earlier runs timed that side less) */
  _Atomic uint32_t turns;
  uint32_t claimed;        /* turns claimed before the verdict closed them: their events are in use */
  _Atomic uint64_t execs;  /* launches that ran it, with cache-stats (g_count_variants) */
  gpu_ctx ctx;             /* where its events were made: a turn elsewhere is lost */
  void *ev[2 * TRIAL_TURNS];   /* each turn's pair, so turns need not wait for the last one's time */
  _Atomic int turn_state[TRIAL_TURNS];
  pthread_mutex_t collect;     /* one collector at a time (trylock) */
  uint32_t collected;
  uint32_t n[2];           /* timed launches: [0] the original's, [1] the variant's */
  float ms[2][TRIAL_RUNS];
} trial;
/* What a launch's pick asks its launch to time: a trial's turn, or nothing (t NULL). */
typedef struct {
  trial *t;
  int turn, recorded;
} trial_ticket;

/* NVTX ranges for profilers (nvtx.c); a push and its pop on one thread. */
HIDDEN void prof_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN void prof_pop(void);

/* ------------------------------------------------------------------ tables.c (layer 0) */

HIDDEN extern pthread_mutex_t reg_lock;   /* registration and inserts */
HIDDEN extern pthread_mutex_t jit_lock;   /* one compilation at a time */
HIDDEN extern kinfo *all_kernels;
/* What the report reads: where the app's threads waited on us (nanoseconds; misses only,
 * never a hit), the CPU of the shim's threads, and CLOCK_MONOTONIC instants (see protocol.h) */
HIDDEN extern _Atomic uint64_t unknown_launches, t_python_ns, t_miss_ns, n_misses, t_prepare_ns, t_exit_wait_ns, t_await_ns,
    n_awaits, t_check_ns, n_checks, n_deferred;
HIDDEN extern _Atomic uint64_t t_loaded_ns, t_main_start_ns, t_main_end_ns, t_main_cpu_ns, t_worker_cpu_ns, t_prestart_cpu_ns;
HIDDEN extern _Atomic uint64_t t_stage_ns[MISS_STAGES];
HIDDEN extern _Atomic uint64_t n_preloaded;   /* variants loaded from answers made ahead (a platform's preload) */
/* Stream captures begun and not ended, counted by the platform that wraps the capture calls
 * (cuda_capture.c): while one is open anywhere, no launch records or queries an event. */
HIDDEN extern _Atomic int captures_open;
HIDDEN extern int g_trace_launch;   /* PROTEUS_TRACE_OUTPUT has "launches" (set by read_env) */
HIDDEN uint64_t now_ns(void);
HIDDEN uint64_t thread_cpu_ns(void);
HIDDEN void stage(int which, uint64_t *t);
HIDDEN void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN extern void *(*real_dlsym)(void *, const char *);
HIDDEN void init_real_dlsym(void);
HIDDEN kinfo *handle_lookup(const void *h);   /* lock-free */
HIDDEN void *handle_owner(const void *h);     /* lock-free: the module or library the handle came from */
HIDDEN void handle_insert(const void *h, kinfo *ki, void *owner);   /* reg_lock held */
HIDDEN kinfo *launched_kernel(const void *handle, dim3 grid, dim3 block);   /* lock-free; counts the launch */
HIDDEN void launch_error(const void *handle);   /* a variant's launch failed: the original ran */
HIDDEN kinfo *find_kernel(const void *image, const char *name);   /* reg_lock held */
HIDDEN void remember(const void *handle, const void *image, const char *name, int owner_kind, void *owner);
HIDDEN void remember_image(void *owner, const void *image);
HIDDEN const void *image_of(void *owner);
HIDDEN void forget_owner(void *owner);
HIDDEN sentry *variant_lookup(uint64_t h, kinfo *ki, gpu_ctx ctx, const uint8_t *key, uint32_t len);
HIDDEN void variant_insert(sentry *ne);   /* jit_lock held */
HIDDEN void for_each_variant(kinfo *ki, void (*f)(sentry *, void *), void *arg);   /* jit_lock or attr_lock held */
HIDDEN sentry *new_entry(kinfo *ki, gpu_ctx ctx, const uint8_t *key, int len, gpu_fn fn, int pending);

/* ------------------------------------------------------------------ jobs.c: one compile request */

/* One compile request: everything the specializer needs, copied out of the launch. */
typedef struct job {
  struct job *next;
  kinfo *ki;
  sentry *e;
  gpu_ctx ctx;
  dim3 grid, block;
  size_t nargs;
  uint8_t *args;
  uint64_t *addrs;
  double gpu_ms;
  gpu_arch arch;
  uint32_t gen;            /* the policy generation of its key: a stale job is dropped */
} job;

/* ------------------------------------------------------------------ python.c (layer 1)
 *
 * The embedded interpreter, and the only file that calls it: each py_* function takes the GIL
 * itself and answers in C types, so no other file knows Python's API or the GIL. Those that
 * read or change a kernel's policy or its deferred launches want jit_lock held. */

HIDDEN extern int py_state;   /* 0 not tried, 1 ready, -1 unavailable */
HIDDEN extern char shim_dir[4096];
HIDDEN void find_shim_dir(void);
HIDDEN int python_ready(void);   /* start (or join) Python and import the runtime; jit_lock held */
HIDDEN int py_running(void);     /* ready, and not finalized since (a host Python may have been) */
HIDDEN int py_holds_gil(void);   /* the calling thread holds the GIL (a Python app's launching thread) */
HIDDEN int read_kernel_info(kinfo *ki, const uint8_t *blob, ssize_t n);
HIDDEN void apply_policy(kinfo *ki, const uint8_t *pol, ssize_t n);
HIDDEN size_t pack_args(kinfo *ki, void **params, uint8_t *out);
HIDDEN ssize_t deferred_bytes(kinfo *ki);   /* the records defer() kept: jit_lock held */
/* runtime.kernel_info for the kernel `name` of `image` on `arch`: its answer (malloc'd; NULL:
 * run the original), for read_kernel_info. */
HIDDEN uint8_t *py_kernel_info(const void *image, const char *name, gpu_arch arch, ssize_t *n);
HIDDEN void py_track(kinfo *ki, void **params, dim3 grid, dim3 block);   /* the tracker alone; its policy applied */
HIDDEN void py_drain_deferred(kinfo *ki);   /* a compile thread, before a job: the GIL first, then jit_lock if free */
HIDDEN void py_drain_all_deferred(void);    /* at exit: every kernel's, where jit_lock is free */
/* What runtime.miss or runtime.specialize answered for a job. */
typedef struct {
  int status;              /* PROTO_MISS_IMAGE, PROTO_MISS_ORIGINAL or PROTO_MISS_POLICY_CHANGED */
  uint32_t track_ns;       /* miss: the tracker's share of the call */
  uint8_t *buf;            /* the answer, which image points into (free it) */
  const uint8_t *image;    /* PROTO_IMAGE: the entry point's name and the image; nimage 0: not in any cache */
  size_t nimage;
} py_answer;
/* The tracker sees the job's launch (after the kernel's deferred ones), and the policy it
 * answers is applied; unless that changed it, the caches (or, without cached_only, the
 * compiler) answer the image. *t: where the wait for the GIL ends (its MISS_GIL stage). */
HIDDEN void py_miss(job *j, int cached_only, py_answer *a, uint64_t *t);
HIDDEN void py_specialize(job *j, int cached_only, py_answer *a, uint64_t *t);   /* the caches, or the compiler, alone */
HIDDEN void py_load_failed(int kid, int error);
HIDDEN void py_prepare_compiler(int sm);
HIDDEN int py_prepare_compiler_ahead(void);   /* 0: declined (the last run compiled nothing) */
HIDDEN uint8_t *py_warm_set(const uint64_t *images, int n, ssize_t *len);
HIDDEN void py_validate_skipped(int kid, uint32_t vid, const char *why);
HIDDEN char *py_validate_refusal(int kid);   /* why its variants must not be checked (malloc'd), or NULL */
HIDDEN void py_checked(int kid, uint32_t vid, const char *verdict, const uint8_t *args, size_t nargs, int allocations,
                       uint64_t size, double ms);
HIDDEN int py_validated(int kid, uint32_t vid, const uint8_t *args, size_t nargs, const uint8_t *ranges, size_t nranges,
                        const uint8_t *variant, const uint8_t *original, const uint8_t *shadow, size_t total, double ms);
HIDDEN void py_finish(const uint8_t *counters, size_t n, const uint8_t *trials, size_t ntrials);
HIDDEN int py_write_report(const char *path, const uint8_t *counters, size_t n, unsigned long long unknown,
                           const unsigned long long w[W_COUNT]);   /* 0: not written */

/* ------------------------------------------------------------------ trial.c (layer 2): speed trials */

/* PROTEUS_SPEED_CHECK: a new variant is timed against the original on live launches, the two
 * taking turns, and dropped (its launches run the original) when it is measured slower. */
HIDDEN extern int g_count_variants;   /* PROTEUS_TRACE_OUTPUT has cache-stats: launches per variant */
HIDDEN void trial_attach(kinfo *ki, sentry *e, uint32_t vid, uint32_t flags, gpu_fn fn);   /* before fn is published */
HIDDEN gpu_fn trial_pick(kinfo *ki, sentry *e, gpu_fn fn, trial_ticket *tk);
HIDDEN void trial_release(void);   /* decided trials' events freed: on a miss, never on a hit */
HIDDEN void turn_begin(trial_ticket *tk, gpu_stream s);
HIDDEN void turn_end(trial_ticket *tk, gpu_stream s);
HIDDEN void trial_finish(void);              /* before exit: the queued turns waited for and judged */
HIDDEN void variant_ran(sentry *e);            /* a launch ran e's variant outside trial_pick (a miss, a wait) */
HIDDEN uint8_t *trial_records(size_t *len);    /* at exit: PROTO_VARIANT each */

/* ------------------------------------------------------------------ check.c (layer 2): a variant's check */

/* PROTEUS_VALIDATE: a variant whose answer asks for a check (PROTO_IMAGE_CHECK) serves no launch
 * until its first launch's results matched the original's (the platform's check, validate_begin
 * and validate_end, cuda_validate.c). g_validate: VALIDATE_OFF, VALIDATE_ONCE (the default: the
 * run time asks only for variants no run has checked; a run spends a bounded share of its time
 * checking) or VALIDATE_FULL (every variant, every run, no budget). */
enum { VALIDATE_OFF, VALIDATE_ONCE, VALIDATE_FULL };
enum { CHECK_IDLE, CHECK_RUNNING, CHECK_DONE };
typedef struct vcheck {
  gpu_fn fn;   /* the variant, published into the entry once checked */
  uint32_t vid;   /* its index in the kernel's report */
  _Atomic int state;
} vcheck;
/* What the check's outcome does with the variant */
enum { CHECKED_SAME, CHECKED_DIFFERS, CHECKED_UNCHECKABLE, CHECKED_LATER };
HIDDEN extern int g_validate;   /* VALIDATE_* */
HIDDEN extern __thread sentry *check_entry
    __attribute__((tls_model("initial-exec")));   /* the entry this thread's launch checks (check_pick), or NULL */
HIDDEN void publish(sentry *e, gpu_fn fn, uint32_t vid, uint32_t flags);   /* a loaded variant, or its check */
HIDDEN gpu_fn check_pick(kinfo *ki, sentry *e);   /* a launch of a variant waiting for its check: it, or NULL */
HIDDEN void check_done(sentry *e, int outcome, uint64_t ns);
/* for the report: the time checks took (the budget's), how many ended, and by phase (CHECK_*,
 * runtime/protocol.py CHECK_PHASES); check_phase adds the time since *since to a phase */
HIDDEN uint64_t check_spent(void);
HIDDEN extern _Atomic uint64_t t_check_phase_ns[CHECK_PHASES], n_checks_made;
HIDDEN void check_phase(int phase, uint64_t *since);

/* ------------------------------------------------------------------ lifecycle.c (layer 3) */

HIDDEN extern int g_disable;
HIDDEN void read_env(void);
HIDDEN void prestart(const struct gpu_ops *platform);   /* Python (and the compiler's warm-up) on a thread of their own */
HIDDEN void before_exit(void);
/* A shim thread that exit has stopped waits for the process to end rather than ending itself:
 * a thread's end runs the driver's and libc's per-thread teardown, which would then overlap the
 * process's own (the runtime destroying its context, the libraries' destructors), an overlap
 * nothing orders. */
__attribute__((noreturn)) static inline void park_for_exit(void) {
  for (;;) pause();
}
HIDDEN extern int exiting;
HIDDEN extern _Atomic int pre_did;

/* ------------------------------------------------------------------ jobs.c (layer 3): the miss path */

/* PROTEUS_ASYNC_COMPILATION: 0 compiles on the launching thread, 1 in the background, the
 * original kernel running until the variant is ready (both upstream's); auto (ours, the
 * default) in the background too, but a launch that asks again for a variant still compiling
 * waits for it (docs/user/policy.md). */
enum { ASYNC_OFF, ASYNC_ON, ASYNC_AUTO };

HIDDEN extern int g_async, g_async_threads;
HIDDEN extern __thread uint64_t tl_load_ns;   /* this thread's time loading variants: a miss's MISS_LOAD stage */
HIDDEN int compile_threads(const char *value, long cpus);
HIDDEN extern pthread_mutex_t q_lock;
HIDDEN extern pthread_cond_t q_cond;
HIDDEN extern job *q_head, *q_tail;
HIDDEN extern int q_stop, q_busy, q_workers;
/* The compiler's warm-up and the prestart thread's state: jobs.c's, since lifecycle.c calls into jobs.c and not the reverse */
enum { PRE_NONE, PRE_PYTHON, PRE_COMPILER, PRE_DONE };
HIDDEN extern pthread_mutex_t pre_lock;
HIDDEN extern pthread_cond_t pre_cond;
HIDDEN extern int pre_state, compiler_prepared, main_wrapped;
HIDDEN void prepare_compiler(int sm, int app_thread);
HIDDEN double gpu_ms(kinfo *ki);
HIDDEN job *make_job(kinfo *ki, void *owner, gpu_ctx ctx, void **params, dim3 grid, dim3 block);
HIDDEN void free_job(job *j);
/* What an answer says of its variant besides the image (protocol.h PROTO_IMAGE_*). */
typedef struct {
  uint32_t vid, flags;
} answer_meta;
HIDDEN gpu_fn run_job(job *j, int cached_only, int *uncached, answer_meta *m);
HIDDEN gpu_fn load_answer(kinfo *ki, const uint8_t *p, size_t n, answer_meta *m);
HIDDEN void resolve(kinfo *ki);   /* a kernel's first launch: which recorded kernel it is. jit_lock held */
HIDDEN void resolve_with(kinfo *ki, const uint8_t *blob, ssize_t n);   /* ... from kernel_info's answer. jit_lock held */
HIDDEN void *worker(void *arg);
HIDDEN void read_async_env(void);   /* jit_lock held */
HIDDEN void stop_workers(void);
HIDDEN void register_atfork(void);   /* fork: the child forgets the shim's threads and their locks */
HIDDEN int defer(kinfo *ki, void **params, dim3 grid, dim3 block);
HIDDEN gpu_fn await_variant(kinfo *ki, sentry *e, gpu_stream stream);
HIDDEN gpu_fn pick_compiling(kinfo *ki, sentry *e, gpu_stream stream, int asked_first);
HIDDEN gpu_fn miss_variant(const void *handle, void **params, dim3 grid, dim3 block, kinfo *ki, gpu_ctx ctx, sentry **served,
                           sentry **compiling, int *asked_first);
HIDDEN gpu_fn pick_miss(const void *handle, void **params, dim3 grid, dim3 block, gpu_stream stream, kinfo *ki, gpu_ctx ctx,
                        int ctx_free);

#endif
