/* The shim's life in the app's process: configuration, the prestart thread that starts Python
 * (and the compiler) beside the app, main() and exit() wrapped so that compile threads stop
 * before any exit handler runs, and the report at exit. The same for every platform: what
 * differs (a compiler warm-up, variants loaded ahead, why there was no GPU) is asked of `gpu`. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "platform.h"
#include "shim.h"

int g_disable = -1;         /* PROTEUS_DISABLE */

void read_env(void) {
  if (g_disable >= 0) return;
  const char *d = getenv(ENV_DISABLE);
  const char *t = getenv(ENV_TRACE_OUTPUT);
  g_trace_launch = t && strstr(t, "launches");   /* ours; upstream's kernel-trace counts at exit */
  g_count_variants = t && strstr(t, "cache-stats");   /* upstream's per-entry cache lines need each variant's launches */
  const char *v = getenv(ENV_VALIDATE);
  /* unset or "once": VALIDATE_ONCE (runtime/validate.py mode reads it alike) */
  g_validate = !v || !*v || !strcasecmp(v, "once")                                        ? VALIDATE_ONCE
               : atoi(v) != 0 || v[0] == 't' || v[0] == 'T' || v[0] == 'y' || v[0] == 'Y' ? VALIDATE_FULL
                                                                                          : VALIDATE_OFF;
  /* upstream reads an integer, any nonzero one disabling; true/yes as this project always took */
  g_disable = d && ((atoi(d) != 0) || d[0] == 't' || d[0] == 'T' || d[0] == 'y' || d[0] == 'Y');
}

/* ------------------------------------------------------------------ start-up off the launch path
 *
 * Starting Python and importing the runtime, and the compiler's first use (loading LLVM and
 * its code generator, one warm-up compilation), each take a tenth of a second or more
 * (docs/dev/findings/startup-and-exit.md, "Start-up beside the app"). Paid on the first
 * launch, both land on the app's critical path. Instead a thread starts them when the app
 * registers its first fat binary (or its CUDA runtime first looks up the driver), while the app
 * is still creating its context, which takes longer. The first miss waits on jit_lock for what
 * is left of it. Not done with PROTEUS_PRESTART=0, PROTEUS_DISABLE=1, no kernel store beside
 * the shim, or a Python of the app's own (whose GIL the app may hold while it launches).
 *
 * The compiler step runs only where exit is guarded: our __libc_start_main wrapper and exit()
 * call before_exit() before any exit handler, and it waits for that step; otherwise a thread
 * inside LLVM could meet LLVM's static destructors (see stop_workers).
 *
 * The state the compile threads share with this thread (pre_lock, pre_state, the warm-up) is
 * jobs.c's, with prepare_compiler: this file calls into jobs.c (stop_workers), so jobs.c must
 * not call back into it. */
int exiting;                   /* pre_lock: before_exit() has run */
_Atomic int pre_did;           /* for the report: bit 0 Python, bit 1 the compiler, started ahead */

static void *prestart_main(void *arg) {
  (void)arg;
  const struct gpu_ops *platform = gpu;
  const struct gpu_preload *preload = platform->preload && platform->preload->enabled() ? platform->preload : NULL;
  uint64_t c0 = thread_cpu_ns();
  /* Before jit_lock, as what follows: finding the driver's version (for runtime.init) and the
   * loaded objects' fat binaries take the loader's lock, which an app thread inside a library's
   * constructor may hold while it launches and waits for jit_lock. */
  if (platform->driver_version) platform->driver_version();
  if (preload) preload->scan();
  pthread_mutex_lock(&jit_lock);
  int ok = python_ready();
  if (ok && preload) preload->first();   /* the last run's launches answered before a first launch can miss */
  pthread_mutex_unlock(&jit_lock);
  if (ok) atomic_fetch_or(&pre_did, 1);
  pthread_mutex_lock(&pre_lock);
  int compile = ok && platform->compiler_warm_up && main_wrapped && !exiting;
  pre_state = compile ? PRE_COMPILER : PRE_DONE;
  pthread_mutex_unlock(&pre_lock);
  if (compile) {
    /* declined (the app's last run compiled nothing): a compile thread does it before its
     * first job */
    int done = py_prepare_compiler_ahead();
    pthread_mutex_lock(&pre_lock);
    pre_state = PRE_DONE;
    compiler_prepared = done;
    if (done) atomic_fetch_or(&pre_did, 2);
    pthread_cond_broadcast(&pre_cond);
    pthread_mutex_unlock(&pre_lock);
  }
  atomic_fetch_add(&t_prestart_cpu_ns, thread_cpu_ns() - c0);
  if (ok && preload) {
    preload->start();   /* answers for the app's images as they come, until exit */
    park_for_exit();
  }
  return NULL;
}

static int has_store(void) {
  const char *dir = getenv(ENV_STORE_DIR);
  DIR *d = opendir(dir && dir[0] ? dir : shim_dir);
  if (!d) return 0;
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    found = n > 7 && !strcmp(e->d_name + n - 7, ".kstore");
  }
  closedir(d);
  return found;
}

/* A platform's first entry points: the process is its (gpu_claim), and Python starts. */
void prestart(const struct gpu_ops *platform) {
  static _Atomic int once;
  if (!gpu_claim(platform) || atomic_exchange(&once, 1)) return;
  read_env();
  const char *p = getenv(ENV_PRESTART);
  if (g_disable || (p && (p[0] == '0' || p[0] == 'f' || p[0] == 'F' || p[0] == 'n'))) return;
  init_real_dlsym();
  void *self = dlopen(NULL, RTLD_NOW);
  if ((self && real_dlsym(self, "Py_IsInitialized")) || !has_store()) return;
  pthread_mutex_lock(&pre_lock);
  pre_state = PRE_PYTHON;
  pthread_mutex_unlock(&pre_lock);
  register_atfork();
  pthread_t t;
  if (pthread_create(&t, NULL, prestart_main, NULL) == 0) {
    pthread_detach(t);
  } else {
    pthread_mutex_lock(&pre_lock);
    pre_state = PRE_DONE;
    pthread_mutex_unlock(&pre_lock);
  }
}

/* Before any exit handler: no new compiler work, and none left running (prestart, workers); the
 * speed trials judged while the app's context still holds their events. */
void before_exit(void) {
  pthread_mutex_lock(&pre_lock);
  exiting = 1;
  while (pre_state == PRE_COMPILER) pthread_cond_wait(&pre_cond, &pre_lock);
  pthread_mutex_unlock(&pre_lock);
  const struct gpu_ops *platform = gpu;   /* (NULL only for an exit before the shim's constructors ran) */
  if (platform && platform->preload) platform->preload->finish();
  stop_workers();
  trial_finish();
  /* the report's reason, decided while the driver may still be asked */
  if (platform && platform->no_gpu_reason) platform->no_gpu_reason(1);
}

typedef int (*main_fn)(int, char **, char **);
static main_fn app_main;

static int wrapped_main(int argc, char **argv, char **envp) {
  uint64_t c0 = thread_cpu_ns();
  atomic_store(&t_main_start_ns, now_ns());
  int r = app_main(argc, argv, envp);
  atomic_store(&t_main_cpu_ns, thread_cpu_ns() - c0);
  atomic_store(&t_main_end_ns, now_ns());
  before_exit();
  return r;
}

/* The executable's _start calls this through its GOT, so the shim (LD_PRELOAD, or the first
 * DT_NEEDED entry of a rewritten executable) sees main return before exit() runs anything. */
EXPORT int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void), void (*fini)(void), void (*rtld_fini)(void),
                             void *stack_end) {
  init_real_dlsym();
  int (*real)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *) =
      (int (*)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *))real_dlsym(RTLD_NEXT,
                                                                                                         "__libc_start_main");
  app_main = main;
  main_wrapped = 1;
  return real(wrapped_main, argc, argv, init, fini, rtld_fini, stack_end);
}

EXPORT void exit(int status) {
  static void (*real_exit)(int);
  uint64_t unset = 0;   /* an app that ends main with exit(): main ends here (its CPU is not taken) */
  if (atomic_load(&t_main_start_ns)) atomic_compare_exchange_strong(&t_main_end_ns, &unset, now_ns());
  if (main_wrapped) before_exit();
  if (!real_exit) {
    init_real_dlsym();
    real_exit = (void (*)(int))real_dlsym(RTLD_NEXT, "exit");
  }
  if (real_exit) real_exit(status);
  _exit(status);
}

/* ------------------------------------------------------------------ the report at exit */

/* Per kernel launched (or run by a graph node): i32 kid (-1: not specialized), u64 launches, hits, fallbacks, launch
 * errors, launches while compiling, launches captured, launches timing a variant, sampled GPU
 * ms x 1000, graph nodes given a variant, launches awaiting a check, name\0 (protocol.COUNTERS). */
static uint8_t *counters(size_t *len) {
  kinfo *head = all_kernels;   /* kernels registered meanwhile go in front of it: the buffer fits these */
  size_t n = 0;
  for (kinfo *k = head; k; k = k->next_all) n++;
  uint8_t *buf = calloc(n + 1, PROTO_COUNTERS + 256);
  *len = 0;
  if (!buf) return NULL;
  for (kinfo *k = head; k; k = k->next_all) {
    if (!atomic_load(&k->launches) && !atomic_load(&k->graph_nodes)) continue;
    int32_t kid = atomic_load(&k->state) == K_ACTIVE ? k->kid : -1;
    uint64_t c[PROTO_COUNTERS_U64] = {atomic_load(&k->launches),         atomic_load(&k->hits),
                                      atomic_load(&k->fallbacks),        atomic_load(&k->launch_errors),
                                      atomic_load(&k->pending_launches), atomic_load(&k->captured),
                                      atomic_load(&k->timing),           (uint64_t)(gpu_ms(k) * 1000.0),
                                      atomic_load(&k->graph_nodes),      atomic_load(&k->awaiting_check)};
    memcpy(buf + *len, &kid, 4);
    memcpy(buf + *len + 4, c, sizeof c);
    *len += PROTO_COUNTERS;
    size_t nl = strnlen(k->name, 255);
    memcpy(buf + *len, k->name, nl);
    buf[*len + nl] = 0;
    *len += nl + 1;
  }
  return buf;
}

/* s as a JSON string: a driver's message may hold anything. */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* The job's rank as proteus_rewrite/jobenv.py's rank() reads it: the first of these variables
 * whose value, blanks around it stripped, is all digits (leading zeros dropped), into out[];
 * 0 where none is (outside a parallel launch). */
static int job_rank(char *out, size_t cap) {
  static const char *const vars[] = {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                     "PMIX_RANK",    "MV2_COMM_WORLD_RANK",  "FLUX_TASK_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (!v) continue;
    while (*v == ' ' || (*v >= '\t' && *v <= '\r')) v++;
    size_t n = 0;
    while (v[n] >= '0' && v[n] <= '9') n++;
    const char *rest = v + n;
    while (*rest == ' ' || (*rest >= '\t' && *rest <= '\r')) rest++;
    if (n == 0 || *rest) continue;   /* empty, or not a non-negative integer: passed over */
    while (n > 1 && *v == '0') v++, n--;
    if (n >= cap) continue;
    memcpy(out, v, n);
    out[n] = 0;
    return 1;
  }
  return 0;
}

/* PROTEUS_REPORT's value with %r (the rank, the pid without one), %p (the pid) and %% filled
 * in, as jobenv.py's expand_path does; any other % is left as it is. 0 when it does not fit. */
static int expand_report_path(const char *path, char *out, size_t cap) {
  char pid[24], rank[64];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  if (!job_rank(rank, sizeof rank)) memcpy(rank, pid, sizeof pid);
  size_t o = 0;
  for (const char *c = path; *c; c++) {
    const char *put = NULL;
    char one[2] = {*c, 0};
    if (c[0] == '%' && (c[1] == 'r' || c[1] == 'p' || c[1] == '%')) {
      put = c[1] == 'r' ? rank : c[1] == 'p' ? pid : "%";
      c++;
    } else {
      put = one;
    }
    size_t n = strlen(put);
    if (o + n >= cap) return 0;
    memcpy(out + o, put, n);
    o += n;
  }
  out[o] = 0;
  return 1;
}

/* At exit (lifecycle.c's destructor): runtime.finish (end-of-run trace lines, the next run's
 * guess whether it compiles), then PROTEUS_REPORT. */
static void report_at_exit(void) {
  if (py_running()) {
    py_drain_all_deferred();   /* what no miss took to the tracker: the report counts it */
    size_t n = 0, nt = 0;
    uint8_t *c = counters(&n);   /* after the deferred launches: they may activate a kernel */
    uint8_t *t = trial_records(&nt);
    py_finish(c, n, t, nt);
    free(c);
    free(t);
  }
  const char *path = getenv(ENV_REPORT);
  if (!path) return;
  const struct gpu_ops *platform = gpu;
  const char *no_gpu = platform && platform->no_gpu_reason ? platform->no_gpu_reason(0) : "";
  if (!all_kernels && !no_gpu[0]) return;
  /* CLOCK_MONOTONIC, as a parent's clock reads it: where a run's time went, from exec to exit */
  unsigned long long timeline[4] = {atomic_load(&t_loaded_ns), atomic_load(&t_main_start_ns), atomic_load(&t_main_end_ns),
                                    now_ns()};
  size_t len = 0;
  uint8_t *buf = counters(&len);
  if (!buf) return;
  /* the figures in write_report's order (protocol.h's W_*, runtime/protocol.py WAIT_FIELDS) */
  unsigned long long w[W_COUNT] = {[W_PYTHON_START] = atomic_load(&t_python_ns),
                                   [W_MISSES] = atomic_load(&t_miss_ns),
                                   [W_MISS_COUNT] = atomic_load(&n_misses),
                                   [W_PREPARE_COMPILER] = atomic_load(&t_prepare_ns),
                                   [W_EXIT] = atomic_load(&t_exit_wait_ns),
                                   [W_PRESTART] = (unsigned long long)atomic_load(&pre_did),
                                   [W_COMPILING] = atomic_load(&t_await_ns),
                                   [W_COMPILING_COUNT] = atomic_load(&n_awaits),
                                   [W_LOCK] = atomic_load(&t_stage_ns[MISS_LOCK]),
                                   [W_RESOLVE] = atomic_load(&t_stage_ns[MISS_RESOLVE]),
                                   [W_TRACK] = atomic_load(&t_stage_ns[MISS_TRACK]),
                                   [W_SPECIALIZE] = atomic_load(&t_stage_ns[MISS_SPECIALIZE]),
                                   [W_QUEUE] = atomic_load(&t_stage_ns[MISS_QUEUE]),
                                   [W_GIL] = atomic_load(&t_stage_ns[MISS_GIL]),
                                   [W_LOAD] = atomic_load(&t_stage_ns[MISS_LOAD]),
                                   [W_COMPILING_CHECKS] = atomic_load(&t_check_ns),
                                   [W_COMPILING_CHECK_COUNT] = atomic_load(&n_checks),
                                   [W_APP_MAIN_CPU] = atomic_load(&t_main_cpu_ns),
                                   [W_COMPILE_THREADS_CPU] = atomic_load(&t_worker_cpu_ns),
                                   [W_PRESTART_CPU] = atomic_load(&t_prestart_cpu_ns),
                                   [W_DEFERRED_COUNT] = atomic_load(&n_deferred),
                                   [W_PRELOADED] = atomic_load(&n_preloaded),
                                   [W_SHIM_LOADED] = timeline[0],
                                   [W_MAIN_START] = timeline[1],
                                   [W_MAIN_END] = timeline[2],
                                   [W_REPORT] = timeline[3],
                                   [W_CHECKS] = check_spent(),
                                   [W_CHECK_COUNT] = atomic_load(&n_checks_made)};
  for (int p = 0; p < CHECK_PHASES; p++) w[W_CHECK_PREPARE + p] = atomic_load(&t_check_phase_ns[p]);
  int written = 0;
  int python = py_running();   /* a host Python may already have finalized */
  if (python && !no_gpu[0])   /* (without a GPU nothing ran that Python would have more to say of) */
    written = py_write_report(path, buf, len, (unsigned long long)atomic_load(&unknown_launches), w);
  if (!written) {   /* Python never started (nothing to compile, PROTEUS_DISABLE), has finalized, or no GPU: counters only */
    char expanded[4096];
    FILE *f = expand_report_path(path, expanded, sizeof expanded) ? fopen(expanded, "w") : NULL;
    if (f) {
      fprintf(f, "{\"pid\": %d, \"python\": %s, \"disabled\": %s, ", (int)getpid(), python ? "true" : "false",
              g_disable ? "true" : "false");
      if (no_gpu[0]) {
        fputs("\"no_gpu\": ", f);
        json_string(f, no_gpu);
        fputs(", ", f);
      }
      fprintf(
          f,
          "\"unknown_handle_launches\": %llu, "
          "\"timeline_ns\": {\"shim_loaded\": %llu, \"main_start\": %llu, \"main_end\": %llu, \"report\": %llu}, \"kernels\": [",
          (unsigned long long)atomic_load(&unknown_launches), timeline[0], timeline[1], timeline[2], timeline[3]);
      const char *sep = "";
      for (size_t off = 0; off < len;) {
        uint64_t c[PROTO_COUNTERS_U64];
        memcpy(c, buf + off + 4, sizeof c);
        const char *name = (const char *)buf + off + PROTO_COUNTERS;
        fprintf(f,
                "%s{\"name\": \"%s\", \"launches\": %llu, \"specialized_launches\": %llu, \"table_hits\": %llu, "
                "\"fallback_launches\": %llu, \"launch_errors\": %llu, \"launches_while_compiling\": %llu, "
                "\"launches_captured\": %llu, \"graph_nodes_specialized\": %llu}",
                sep, name, (unsigned long long)c[0], (unsigned long long)(c[0] - c[2] - c[3] - c[4] - c[5] - c[6]),
                (unsigned long long)c[1], (unsigned long long)(c[2] + c[3] + c[4] + c[6]), (unsigned long long)c[3],
                (unsigned long long)c[4], (unsigned long long)c[5], (unsigned long long)c[8]);
        sep = ", ";
        off += PROTO_COUNTERS + strlen(name) + 1;
      }
      fprintf(f, "]}\n");
      fclose(f);
    }
  }
  free(buf);
}

__attribute__((constructor)) static void proteus_init(void) {
  atomic_store(&t_loaded_ns, now_ns());
  find_shim_dir();
  read_env();
}

__attribute__((destructor)) static void proteus_fini(void) { report_at_exit(); }
