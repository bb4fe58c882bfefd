/* The shim's life in the app's process: configuration, the dlsym it interposes, the prestart
 * thread that starts Python (and the compiler) beside the app, main() and exit() wrapped so that
 * compile threads stop before any exit handler runs, and the report at exit. */
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
#include "shim.h"

int g_disable = -1;         /* PROTEUS_DISABLE */
int g_trace_launch;          /* PROTEUS_TRACE_OUTPUT contains "launches" (ours; upstream's kernel-trace counts at exit) */

void read_env(void) {
  if (g_disable >= 0) return;
  const char *d = getenv(ENV_DISABLE);
  const char *t = getenv(ENV_TRACE_OUTPUT);
  g_trace_launch = t && strstr(t, "launches");
  g_count_variants = t && strstr(t, "cache-stats");   /* upstream's per-entry cache lines need each variant's launches */
  const char *v = getenv(ENV_VALIDATE);
  g_validate = v && (atoi(v) != 0 || v[0] == 't' || v[0] == 'T' || v[0] == 'y' || v[0] == 'Y');
  /* upstream reads an integer, any nonzero one disabling; true/yes as this project always took */
  g_disable = d && ((atoi(d) != 0) || d[0] == 't' || d[0] == 'T' || d[0] == 'y' || d[0] == 'Y');
}

void warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "proteus: warning: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ------------------------------------------------------------------ real functions */

void *(*real_dlsym)(void *, const char *);

void init_real_dlsym(void) {
  if (real_dlsym) return;
  /* dlsym itself is interposed: reach glibc's through its versioned name. */
  static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
  for (int i = 0; versions[i] && !real_dlsym; i++)
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}


/* ------------------------------------------------------------------ start-up off the launch path
 *
 * Starting Python and importing the runtime takes 0.15 s, and the compiler's first use (loading
 * LLVM and nvJitLink, one warm-up compilation) 0.1-0.2 s more. Paid on the first launch, both
 * land on the app's critical path. Instead a thread starts them when the app registers its
 * first fat binary (or its CUDA runtime first looks up the driver), while the app is still
 * creating its CUDA context, which takes longer. The first miss waits on jit_lock for what is
 * left of it. Not done with PROTEUS_PRESTART=0, PROTEUS_DISABLE=1, no kernel store beside the
 * shim, or a Python of the app's own (whose GIL the app may hold while it launches).
 *
 * The compiler step runs only where exit is guarded: our __libc_start_main wrapper and exit()
 * call before_exit() before any exit handler, and it waits for that step; otherwise a thread
 * inside LLVM could meet LLVM's static destructors (see stop_workers). */
pthread_mutex_t pre_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pre_cond = PTHREAD_COND_INITIALIZER;
int pre_state;                 /* pre_lock */
int exiting;                   /* pre_lock: before_exit() has run */
static int compiler_prepared;         /* pre_lock */
int main_wrapped;              /* our __libc_start_main runs the app's main */
_Atomic int pre_did;           /* for the report: bit 0 Python, bit 1 the compiler, started ahead */

/* The compiler warm-up, once, from whichever thread comes first (the prestart thread, a compile
 * thread, or the first compile request); a caller that finds it running waits for it. Counted
 * as the app's wait when an app thread runs it. */
void prepare_compiler(int arch, int app_thread) {
  pthread_mutex_lock(&pre_lock);
  while (pre_state == PRE_COMPILER) pthread_cond_wait(&pre_cond, &pre_lock);
  int todo = !compiler_prepared;
  compiler_prepared = 1;
  pthread_mutex_unlock(&pre_lock);
  if (!todo) return;
  uint64_t t0 = now_ns();
  int g = py.GILStateEnsure();
  PyObject *r = py.CallFunction(f_prepare_compiler, FMT_PREPARE_COMPILER, arch);
  if (r) py.DecRef(r); else py.ErrPrint();
  py.GILStateRelease(g);
  if (app_thread) atomic_fetch_add(&t_prepare_ns, now_ns() - t0);
}

static void *prestart_main(void *arg) {
  int cuda = arg != NULL;
  uint64_t c0 = thread_cpu_ns();
  if (cuda && !real_cuDriverGetVersion) *(void **)&real_cuDriverGetVersion = cuda_sym("cuDriverGetVersion");   /* needs no cuInit */
  int preload = cuda && warm_enabled();
  if (preload) warm_scan();   /* the loaded objects' fat binaries (before jit_lock: it takes the loader's lock) */
  pthread_mutex_lock(&jit_lock);
  int ok = python_ready();
  if (ok && preload) warm_first();   /* the last run's launches answered before a first launch can miss */
  pthread_mutex_unlock(&jit_lock);
  if (ok) atomic_fetch_or(&pre_did, 1);
  pthread_mutex_lock(&pre_lock);
  int compile = ok && cuda && main_wrapped && !exiting;
  pre_state = compile ? PRE_COMPILER : PRE_DONE;
  pthread_mutex_unlock(&pre_lock);
  if (compile) {
    int g = py.GILStateEnsure();
    /* 0: no context yet, any architecture; 1: ahead, so it may decline (the app's last run
     * compiled nothing), and then a compile thread does it before its first job */
    PyObject *r = py.CallFunction(f_prepare_compiler, FMT_PREPARE_COMPILER_AHEAD, 0, 1);
    int done = 1;
    if (r) { done = py.LongAsLongLong(r) != 0; py.DecRef(r); } else py.ErrPrint();
    py.GILStateRelease(g);
    pthread_mutex_lock(&pre_lock);
    pre_state = PRE_DONE;
    compiler_prepared = done;
    if (done) atomic_fetch_or(&pre_did, 2);
    pthread_cond_broadcast(&pre_cond);
    pthread_mutex_unlock(&pre_lock);
  }
  atomic_fetch_add(&t_prestart_cpu_ns, thread_cpu_ns() - c0);
  if (ok && preload) warm_start();   /* answers for the app's images as they come, until exit */
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

void prestart(int cuda) {
  static _Atomic int once;
  if (atomic_exchange(&once, 1)) return;
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
  if (pthread_create(&t, NULL, prestart_main, cuda ? (void *)1 : NULL) == 0) {
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
  warm_finish();
  stop_workers();
  trial_finish();
  no_gpu_reason(1);   /* the report's, decided while the driver may still be asked */
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
EXPORT int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void), void (*fini)(void),
                             void (*rtld_fini)(void), void *stack_end) {
  init_real_dlsym();
  int (*real)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *) =
      (int (*)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *))real_dlsym(RTLD_NEXT, "__libc_start_main");
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


__attribute__((constructor)) static void proteus_init(void) {
  atomic_store(&t_loaded_ns, now_ns());
  find_shim_dir();
  read_env();
}

__attribute__((destructor)) static void proteus_fini(void) { report_at_exit(); }

