/* What the translation units of libproteus.so share: tables.c (handles, images, variants),
 * hitpath.h (the inlined hit path), python.c (the embedded runtime), jobs.c (the miss path and
 * compile threads), lifecycle.c (start-up, exit, the report), and the platforms: cuda.c
 * (cuda_api.h) and hip.c (hip_api.h). Everything declared here has hidden visibility: internal
 * to the shim, never exported to the app (the interposed entry points are marked EXPORT where
 * they are defined). No CUDA or HIP headers: the few types are declared here. What crosses into
 * Python is laid out in protocol.h, generated from proteus_rewrite/runtime/protocol.py. */
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
#include <sys/types.h>

#include "protocol.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUlibrary, *CUkernel;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned x, y, z; } dim3;
typedef int cudaError_t;
typedef struct {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  CUstream hStream;
  void *attrs;
  unsigned numAttrs;
} CUlaunchConfig;
typedef struct {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  void *stream;
  void *attrs;
  unsigned numAttrs;
} cudaLaunchConfig_t;

#define CUDA_SUCCESS 0
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define MAX_PARAMS 256
#define MAX_KEY 4096
#define MAX_ATTRS 16

/* ------------------------------------------------------------------ kernels and handles */

/* Who owns a kernel's handle, which says how its device variables are found. */
enum { OWNER_NONE, OWNER_MODULE, OWNER_LIBRARY, OWNER_RUNTIME, OWNER_HIP_RUNTIME, OWNER_HIP_MODULE };
enum { K_UNRESOLVED, K_ACTIVE, K_DISABLED };
enum { SAMPLE_IDLE, SAMPLE_RECORDING, SAMPLE_PENDING, SAMPLE_OFF };

typedef struct var_reg { struct var_reg *next; const void *fatbin; const void *host; char *name; } var_reg;

struct sentry;

/* A hit reads this in the app's launch call, between the driver's work for the previous launch
 * and the app's own, which push it out of the near caches: each line it touches and each
 * pointer it follows cost a cache miss then (bench/hitpath.c, EVICT_KB). So what a hit reads
 * comes first, in one line, and the hit follows at most three pointers: the handle's slot, this,
 * and the variant (`last`, or the table's). */
typedef struct __attribute__((aligned(64))) kinfo {
  _Atomic int state;
  /* Its variants serve every context (CUDA): loaded as libraries and launched by their
   * CUkernel, they are keyed without the context, so a hit asks the driver nothing (a
   * cuCtxGetCurrent cost 90 ns of a launch's 3.5 us on the H100 host). Not for a kernel
   * whose variants hold a context's device-variable addresses, nor across GPUs of different
   * architectures. Set before `state` turns K_ACTIVE. */
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
  CUcontext ev_ctx;
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
  struct { int attrib, value, dev; } attrs[MAX_ATTRS];
  int nattrs;
  _Atomic uint64_t timing;   /* launches that ran the original to time a variant against it */
  _Atomic uint64_t graph_nodes;   /* kernel nodes of instantiated graphs pointed at a variant (cuda_graph.c) */
} kinfo;
_Static_assert(offsetof(kinfo, fold) == 64, "a hit's scalars share the first cache line");

typedef struct sentry {
  uint64_t hash;
  kinfo *ki;
  CUcontext ctx;           /* CUDA: the context; HIP: the device (its ordinal + 1) */
  _Atomic(CUfunction) fn;  /* NULL: failed, or still compiling in the background: run the original */
  _Atomic int pending;
  uint32_t keylen;
  /* What the shim follows of it while it does (trial.c: its speed trial, or its launches for
   * upstream's cache-stats lines): a hit that finds it set goes out of line. */
  _Atomic(struct trial *) trial;
  uint8_t key[];
} sentry;

/* ------------------------------------------------------------------ trial.c: speed trials */

/* PROTEUS_SPEED_CHECK: a new variant is timed against the original on live launches, the two
 * taking turns, and dropped (its launches run the original) when it is measured slower. */
#define TRIAL_AFTER 8         /* variant launches before the trial: a kernel launched less is never timed */
#define TRIAL_RUNS 6          /* timed launches per side; the first of each is not counted (a first launch loads code) */
#define TRIAL_TURNS (2 * TRIAL_RUNS)
#define TRIAL_MARGIN 0.03     /* slower: the variant's median above the original's by more than this share, */
#define TRIAL_FLOOR_MS 0.003  /* and by more than this, and its every counted launch above the original's median */
enum { TRIAL_RUNNING = PROTO_TRIAL_UNDECIDED, TRIAL_KEPT = PROTO_TRIAL_KEPT, TRIAL_SLOWER = PROTO_TRIAL_SLOWER,
       TRIAL_ENDED };   /* ENDED: no verdict (turns lost to a capture or another context); the variant stays */
enum { TURN_FREE, TURN_RECORDED, TURN_FAILED };
typedef struct trial {
  struct trial *next;
  struct trial *next_spent;   /* decided, its events not yet freed (trial.c trial_release) */
  kinfo *ki;
  struct sentry *e;
  uint32_t vid;            /* the variant's index in the kernel's report */
  int timed_trial;         /* a speed trial (else only its launches are counted) */
  _Atomic int verdict;
  _Atomic uint32_t launches, turns;
  _Atomic uint64_t execs;  /* launches that ran it, with cache-stats (g_count_variants) */
  CUcontext ctx;           /* where its events were made: a turn elsewhere is lost */
  void *ev[2 * TRIAL_TURNS];   /* each turn's pair, so turns need not wait for the last one's time */
  _Atomic int turn_state[TRIAL_TURNS];
  pthread_mutex_t collect;     /* one collector at a time (trylock) */
  uint32_t collected;
  uint32_t n[2];
  float ms[2][TRIAL_RUNS];
  float median[2], min[2];
} trial;
/* What a launch's pick asks its launch to time: a trial's turn, or nothing (t NULL). */
typedef struct { trial *t; int turn, recorded; } trial_ticket;

/* NVTX ranges for profilers (nvtx.c); a push and its pop on one thread. */
HIDDEN void prof_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN void prof_pop(void);
HIDDEN extern int g_count_variants;   /* PROTEUS_TRACE_OUTPUT has cache-stats: launches per variant */
HIDDEN void trial_attach(kinfo *ki, sentry *e, uint32_t vid, uint32_t flags, CUfunction fn);   /* before fn is published */
HIDDEN CUfunction trial_pick(kinfo *ki, sentry *e, CUfunction fn, trial_ticket *tk);
HIDDEN void trial_release(void);   /* decided trials' events freed: on a miss, never on a hit */
HIDDEN void turn_begin(trial_ticket *tk, CUstream s);
HIDDEN void turn_end(trial_ticket *tk, CUstream s);
HIDDEN void trial_finish(void);              /* before exit: the queued turns waited for and judged */
HIDDEN void variant_ran(sentry *e);            /* a launch ran e's variant outside trial_pick (a miss, a wait) */
HIDDEN uint8_t *trial_records(size_t *len);    /* at exit: PROTO_VARIANT each */

/* ------------------------------------------------------------------ embedded Python */

typedef void PyObject;
typedef struct {
  int (*IsInitialized)(void);
  void (*InitializeEx)(int);
  void *(*EvalSaveThread)(void);
  int (*GILStateEnsure)(void);
  void (*GILStateRelease)(int);
  int (*GILStateCheck)(void);
  int (*RunSimpleString)(const char *);
  PyObject *(*ImportModule)(const char *);
  PyObject *(*GetAttrString)(PyObject *, const char *);
  PyObject *(*CallFunction)(PyObject *, const char *, ...);
  int (*BytesAsStringAndSize)(PyObject *, char **, ssize_t *);
  long long (*LongAsLongLong)(PyObject *);
  void (*ErrPrint)(void);
  void (*DecRef)(PyObject *);
  PyObject *None;
} py_api;

/* ------------------------------------------------------------------ lifecycle.c */

HIDDEN extern int g_disable, g_trace_launch, g_validate;
HIDDEN void read_env(void);
HIDDEN void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN extern void *(*real_dlsym)(void *, const char *);
HIDDEN void init_real_dlsym(void);
HIDDEN void prestart(int cuda);   /* Python (and for CUDA the compiler) on a thread of their own */
HIDDEN void prepare_compiler(int arch, int app_thread);
HIDDEN void before_exit(void);
enum { PRE_NONE, PRE_PYTHON, PRE_COMPILER, PRE_DONE };
HIDDEN extern pthread_mutex_t pre_lock;
HIDDEN extern int pre_state, main_wrapped, exiting;
HIDDEN extern _Atomic int pre_did;

/* ------------------------------------------------------------------ tables.c */

HIDDEN extern pthread_mutex_t reg_lock;   /* registration and inserts */
HIDDEN extern pthread_mutex_t jit_lock;   /* one compilation at a time */
HIDDEN extern kinfo *all_kernels;
HIDDEN extern var_reg *all_vars;
/* What the report reads: where the app's threads waited on us (nanoseconds; misses only,
 * never a hit), the CPU of the shim's threads, and CLOCK_MONOTONIC instants (see protocol.h) */
HIDDEN extern _Atomic uint64_t unknown_launches, t_python_ns, t_miss_ns, n_misses, t_prepare_ns, t_exit_wait_ns,
    t_await_ns, n_awaits, t_check_ns, n_checks, n_deferred;
HIDDEN extern _Atomic uint64_t t_loaded_ns, t_main_start_ns, t_main_end_ns, t_main_cpu_ns, t_worker_cpu_ns,
    t_prestart_cpu_ns;
HIDDEN extern _Atomic uint64_t t_stage_ns[MISS_STAGES];
HIDDEN extern __thread uint64_t tl_load_ns;
HIDDEN extern _Atomic uint64_t n_preloaded;   /* variants loaded from answers made ahead (cuda_warm.c) */
/* cuda_warm.c: the last run's variants, answered ahead, loaded at their first launch */
HIDDEN void warm_image(const void *image);                  /* a fat binary registered or loaded */
HIDDEN int warm_scan(void);                                  /* the loaded objects' .nvFatBinSegment: fat binaries new */
HIDDEN int fatbins_seen(void);                               /* fat binaries known, after a scan */
HIDDEN int warm_enabled(void);                               /* PROTEUS_PRELOAD */
HIDDEN void warm_first(void);                                /* the prestart thread, Python up: answers (jit_lock) */
HIDDEN void warm_start(void);                                /* then answers for images loaded later, until warm_finish */
HIDDEN void warm_resolve(kinfo *ki, CUcontext ctx);          /* a first launch: the answers made ahead for it (jit_lock) */
HIDDEN void warm_finish(void);                               /* before exit handlers */
HIDDEN void warm_atfork_child(void);
HIDDEN uint64_t now_ns(void);
HIDDEN uint64_t thread_cpu_ns(void);
HIDDEN void stage(int which, uint64_t *t);
HIDDEN kinfo *handle_lookup(const void *h);   /* lock-free */
HIDDEN void *handle_owner(const void *h);     /* lock-free: the module or library the handle came from */
HIDDEN void handle_insert(const void *h, kinfo *ki, void *owner);   /* reg_lock held */
HIDDEN kinfo *launched_kernel(const void *handle, dim3 grid, dim3 block);   /* lock-free; counts the launch */
HIDDEN kinfo *find_kernel(const void *image, const char *name);   /* reg_lock held */
HIDDEN void remember(const void *handle, const void *image, const char *name, int owner_kind, void *owner);
HIDDEN void remember_image(void *owner, const void *image);
HIDDEN const void *image_of(void *owner);
HIDDEN void forget_owner(void *owner);
HIDDEN sentry *variant_lookup(uint64_t h, kinfo *ki, CUcontext ctx, const uint8_t *key, uint32_t len);
HIDDEN void variant_insert(sentry *ne);   /* jit_lock held */
HIDDEN void for_each_variant(kinfo *ki, void (*f)(sentry *, void *), void *arg);   /* jit_lock or attr_lock held */
HIDDEN sentry *new_entry(kinfo *ki, CUcontext ctx, const uint8_t *key, int len, CUfunction fn, int pending);
HIDDEN void launch_error(const void *handle);

/* ------------------------------------------------------------------ python.c (jit_lock held for all but py_bytes) */

HIDDEN extern py_api py;
HIDDEN extern PyObject *f_warm_set, *f_kernel_info, *f_specialize, *f_track, *f_load_failed, *f_write_report, *f_prepare_compiler,
    *f_finish, *f_miss, *f_track_deferred, *f_validated, *f_validate_skipped, *f_validate_refusal;
HIDDEN extern int py_state;   /* 0 not tried, 1 ready, -1 unavailable */
HIDDEN extern char shim_dir[4096];
HIDDEN void find_shim_dir(void);
HIDDEN int python_ready(void);
HIDDEN uint8_t *py_bytes(PyObject *res, ssize_t *len);
HIDDEN int read_kernel_info(kinfo *ki, const uint8_t *blob, ssize_t n);
HIDDEN void apply_policy(kinfo *ki, const uint8_t *pol, ssize_t n);
HIDDEN size_t pack_args(kinfo *ki, void **params, uint8_t *out);
HIDDEN void track(kinfo *ki, void **params, dim3 grid, dim3 block);
HIDDEN void pass_deferred(kinfo *ki);   /* the GIL and jit_lock held */
HIDDEN ssize_t deferred_bytes(kinfo *ki);   /* the records defer() kept: jit_lock held */
HIDDEN void report_at_exit(void);

/* ------------------------------------------------------------------ jobs.c: the miss path */

/* PROTEUS_ASYNC_COMPILATION: 0 compiles on the launching thread, 1 in the background, the
 * original kernel running until the variant is ready (both upstream's); auto (ours, the
 * default) in the background too, but a launch that asks again for a variant still compiling
 * waits for it (docs/user/policy.md). */
enum { ASYNC_OFF, ASYNC_ON, ASYNC_AUTO };

/* One compile request: everything the specializer needs, copied out of the launch. */
typedef struct job {
  struct job *next;
  kinfo *ki;
  sentry *e;
  CUcontext ctx;
  dim3 grid, block;
  size_t nargs;
  uint8_t *args;
  uint64_t *addrs;
  double gpu_ms;
  int arch;
  uint32_t gen;            /* the policy generation of its key: a stale job is dropped */
} job;

HIDDEN extern int g_async, g_async_threads;
HIDDEN int compile_threads(const char *value, long cpus);
HIDDEN extern pthread_mutex_t q_lock;
HIDDEN extern pthread_cond_t q_cond;
HIDDEN extern job *q_head, *q_tail;
HIDDEN extern int q_stop, q_busy, q_workers;
HIDDEN double gpu_ms(kinfo *ki);
HIDDEN job *make_job(kinfo *ki, void *owner, CUcontext ctx, void **params, dim3 grid, dim3 block);
HIDDEN void free_job(job *j);
/* What an answer says of its variant besides the image (protocol.h PROTO_IMAGE_*). */
typedef struct { uint32_t vid, flags; } answer_meta;
HIDDEN CUfunction run_job(job *j, int cached_only, int *uncached, answer_meta *m);
HIDDEN CUfunction load_answer(kinfo *ki, const uint8_t *p, size_t n, answer_meta *m);   /* the GIL held */
HIDDEN CUfunction miss_job(job *j, int cached_only, int *uncached, int *changed, uint64_t *track_ns, answer_meta *m);
HIDDEN void *worker(void *arg);
HIDDEN void read_async_env(void);   /* jit_lock held */
HIDDEN void stop_workers(void);
HIDDEN void register_atfork(void);
HIDDEN int defer(kinfo *ki, void **params, dim3 grid, dim3 block);
HIDDEN CUfunction await_variant(kinfo *ki, sentry *e, CUstream stream);
HIDDEN CUfunction pick_compiling(kinfo *ki, sentry *e, CUstream stream, int asked_first);
HIDDEN extern _Atomic int captures_open;   /* stream captures begun and not ended (cuda_capture.c) */
HIDDEN int stream_capturing(CUstream s);
HIDDEN void relax_capture_mode(void);
HIDDEN CUfunction miss_variant(const void *handle, void **params, dim3 grid, dim3 block, kinfo *ki, CUcontext ctx,
                               sentry **served, sentry **compiling, int *asked_first);
HIDDEN CUfunction pick_miss(const void *handle, void **params, dim3 grid, dim3 block, CUstream stream, kinfo *ki,
                            CUcontext ctx, int ctx_free);

#endif
