/* The embedded interpreter, and the one file of the shim that calls it (tests/shim/test_layers.py):
 * started from proteus-python.cfg (or the app's own), it answers every other file through the
 * typed py_* functions below. Each takes the GIL itself and hands back C types decoded from
 * the layouts of protocol.h, so no other file knows Python's API, its objects or the GIL's
 * rules. Bytes and small integers cross, never an object C would have to interpret; an
 * exception in the run time is printed and becomes "run the original". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "platform.h"
#include "shim.h"

/* The CPython API, resolved with dlsym from the libpython proteus-python.cfg names (or the
 * app's own), so that the shim links against no libpython. */
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

static py_api py;
static PyObject *rt;              /* the proteus_rewrite.runtime module */
static PyObject *f_warm_set, *f_kernel_info, *f_specialize, *f_track, *f_load_failed, *f_write_report, *f_prepare_compiler,
    *f_finish, *f_miss, *f_track_deferred, *f_checked, *f_validated, *f_validate_skipped, *f_validate_refusal;
int py_state;              /* 0 not tried, 1 ready, -1 unavailable */

char shim_dir[4096];

void find_shim_dir(void) {
  Dl_info info;
  if (dladdr((void *)find_shim_dir, &info) && info.dli_fname) {
    snprintf(shim_dir, sizeof shim_dir, "%s", info.dli_fname);
    char *slash = strrchr(shim_dir, '/');
    if (slash) *slash = 0;
    else strcpy(shim_dir, ".");
  }
}

/* proteus-python.cfg beside the shim, written by `proteus-rewrite APP`: which Python has
 * proteus_rewrite installed. Lines "libpython PATH", "home PATH", "path PATH". */
static int python_config(char *lib, size_t nlib, char *home, size_t nhome, char *paths, size_t npaths) {
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "%s/proteus-python.cfg", shim_dir);
  FILE *f = fopen(cfg, "r");
  if (!f) return -1;
  char line[4200];
  lib[0] = home[0] = paths[0] = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!strncmp(line, "libpython ", 10)) snprintf(lib, nlib, "%.4000s", line + 10);
    else if (!strncmp(line, "home ", 5)) snprintf(home, nhome, "%.4000s", line + 5);
    else if (!strncmp(line, "path ", 5)) {
      size_t used = strlen(paths);
      snprintf(paths + used, npaths - used, "%s%s", used ? "\n" : "", line + 5);
    }
  }
  fclose(f);
  return lib[0] ? 0 : -1;
}

static int load_python_symbols(void *h) {
#define PYSYM(field, sym) \
  if (!(*(void **)&py.field = real_dlsym(h, sym))) return -1
  PYSYM(IsInitialized, "Py_IsInitialized");
  PYSYM(InitializeEx, "Py_InitializeEx");
  PYSYM(EvalSaveThread, "PyEval_SaveThread");
  PYSYM(GILStateEnsure, "PyGILState_Ensure");
  PYSYM(GILStateRelease, "PyGILState_Release");
  PYSYM(RunSimpleString, "PyRun_SimpleString");
  PYSYM(GILStateCheck, "PyGILState_Check");
  PYSYM(ImportModule, "PyImport_ImportModule");
  PYSYM(GetAttrString, "PyObject_GetAttrString");
  /* '#' formats take Py_ssize_t lengths only in the _SizeT variant before Python 3.13 */
  if (!(*(void **)&py.CallFunction = real_dlsym(h, "_PyObject_CallFunction_SizeT"))) PYSYM(CallFunction, "PyObject_CallFunction");
  PYSYM(BytesAsStringAndSize, "PyBytes_AsStringAndSize");
  PYSYM(LongAsLongLong, "PyLong_AsLongLong");
  PYSYM(ErrPrint, "PyErr_Print");
  PYSYM(DecRef, "Py_DecRef");
  PYSYM(None, "_Py_NoneStruct");
#undef PYSYM
  return 0;
}

/* Start (or join) Python and import the runtime. Called with jit_lock held. */
static int start_python(void);

int python_ready(void) {
  if (py_state) return py_state > 0;
  py_state = -1;
  uint64_t t0 = now_ns();
  int ok = start_python();
  atomic_store(&t_python_ns, now_ns() - t0);
  py_state = ok ? 1 : -1;
  return ok;
}

static int start_python(void) {
  init_real_dlsym();
  void *self = dlopen(NULL, RTLD_NOW);
  int host_python = self && real_dlsym(self, "Py_IsInitialized") && load_python_symbols(self) == 0 && py.IsInitialized();
  if (!host_python) {
    char lib[4096], home[4096], paths[16384];
    if (python_config(lib, sizeof lib, home, sizeof home, paths, sizeof paths) != 0) {
      warn("no usable %s/proteus-python.cfg: run proteus-rewrite again; kernels run unspecialized", shim_dir);
      return 0;
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);   /* global: extension modules need its symbols */
    if (!h || load_python_symbols(h) != 0) {
      warn("cannot load %s (%s); kernels run unspecialized", lib, h ? "missing symbols" : dlerror());
      return 0;
    }
    if (!py.IsInitialized()) {
      char *old_home = getenv("PYTHONHOME") ? strdup(getenv("PYTHONHOME")) : NULL;
      if (home[0] && !old_home) setenv("PYTHONHOME", home, 1);
      /* Without `site`: its .pth hooks run at every start of every app, and another package's
       * took a large share of the start-up (docs/dev/findings/startup-and-exit.md, "Start-up beside
       * the app"). The sys.path recorded from the Python that ran proteus-rewrite
       * already holds every directory they add, this package's own first (an editable
       * install's finder is not needed). */
      int *no_site = real_dlsym(h, "Py_NoSiteFlag");
      if (no_site) *no_site = 1;
      py.InitializeEx(0);                     /* 0: leave the app's signal handlers alone */
      if (old_home) free(old_home);
      else unsetenv("PYTHONHOME");
      size_t cap = strlen(paths) * 2 + 256;
      char *code = malloc(cap);
      if (!code) return 0;
      /* The switch interval: a launching thread that needs the GIL (a miss asks the tracker and
       * the caches) while a compile thread runs Python can wait up to the default 5 ms for it,
       * at every miss. Our own interpreter only: a host Python keeps its setting. */
      int n = snprintf(code, cap,
                       "import sys\nrecorded = r'''%s'''.splitlines()\n"
                       "sys.path[:] = recorded + [p for p in sys.path if p not in recorded]\n"
                       "sys.setswitchinterval(0.0002)\n",
                       paths);
      int rc = (n > 0 && (size_t)n < cap) ? py.RunSimpleString(code) : -1;
      free(code);
      py.EvalSaveThread();                    /* release the GIL: every call takes it */
      if (rc != 0) {
        warn("setting up the embedded Python failed");
        return 0;
      }
    }
  }
  int g = py.GILStateEnsure();
  rt = py.ImportModule("proteus_rewrite.runtime");
  int ok = 0;
  if (!rt) {
    py.ErrPrint();
    warn("cannot import proteus_rewrite.runtime; kernels run unspecialized");
  } else {
    const struct gpu_ops *platform = gpu;
    int drv = platform && platform->driver_version ? platform->driver_version() : 0;
    PyObject *init = py.GetAttrString(rt, CALL_INIT);
    PyObject *r = init ? py.CallFunction(init, FMT_INIT, shim_dir, drv) : NULL;
    f_kernel_info = py.GetAttrString(rt, CALL_KERNEL_INFO);
    f_specialize = py.GetAttrString(rt, CALL_SPECIALIZE);
    f_track = py.GetAttrString(rt, CALL_TRACK);
    f_load_failed = py.GetAttrString(rt, CALL_LOAD_FAILED);
    f_write_report = py.GetAttrString(rt, CALL_WRITE_REPORT);
    f_prepare_compiler = py.GetAttrString(rt, CALL_PREPARE_COMPILER);
    f_finish = py.GetAttrString(rt, CALL_FINISH);
    f_miss = py.GetAttrString(rt, CALL_MISS);
    f_track_deferred = py.GetAttrString(rt, CALL_TRACK_DEFERRED);
    f_checked = py.GetAttrString(rt, CALL_CHECKED);
    f_validated = py.GetAttrString(rt, CALL_VALIDATED);
    f_validate_skipped = py.GetAttrString(rt, CALL_VALIDATE_SKIPPED);
    f_validate_refusal = py.GetAttrString(rt, CALL_VALIDATE_REFUSAL);
    f_warm_set = py.GetAttrString(rt, CALL_WARM_SET);
    if (r && f_kernel_info && f_specialize && f_track && f_load_failed && f_write_report && f_prepare_compiler && f_finish &&
        f_miss && f_track_deferred && f_checked && f_validated && f_validate_skipped && f_validate_refusal && f_warm_set) {
      ok = py.LongAsLongLong(r) == 1;   /* False: a bad setting, which init has reported in one line */
      py.DecRef(r);
    } else py.ErrPrint();
  }
  py.GILStateRelease(g);
  return ok;
}


int py_running(void) { return py_state > 0 && py.IsInitialized(); }

int py_holds_gil(void) { return py.GILStateCheck && py.GILStateCheck(); }

/* A call's result as bytes (copied into *out, malloc'ed), or NULL for None or a failure (its
 * exception printed). The GIL held. */
static uint8_t *py_bytes(PyObject *res, ssize_t *len) {
  if (!res) {
    py.ErrPrint();
    return NULL;
  }
  uint8_t *out = NULL;
  char *buf;
  ssize_t n;
  if (res != py.None && py.BytesAsStringAndSize(res, &buf, &n) == 0 && (out = malloc(n ? n : 1))) {
    memcpy(out, buf, n);
    *len = n;
  }
  py.DecRef(res);
  return out;
}

/* A call whose result is not read. The GIL held. */
static void done_with(PyObject *res) {
  if (res) py.DecRef(res);
  else py.ErrPrint();
}

/* Python's kernel_info reply: u32 kid, nparams, dims_in_key, nglobals, defer_max; u32 sizes[nparams];
 * u8 fold[nparams]; names\0... Returns 1 when it describes the kernel (which may then be
 * specialized), 0 for None or a malformed reply. */
int read_kernel_info(kinfo *ki, const uint8_t *blob, ssize_t n) {
  uint32_t hdr[5];
  if (!blob || n < 20) return 0;
  memcpy(hdr, blob, 20);
  if (hdr[1] > MAX_PARAMS || (size_t)n < 20 + hdr[1] * 5u) return 0;
  ki->kid = (int)hdr[0];
  ki->nparams = hdr[1];
  ki->nglobals = hdr[3];
  ki->defer_max = hdr[4];
  atomic_store(&ki->dims_in_key, hdr[2]);
  memcpy(ki->sizes, blob + 20, hdr[1] * 4u);
  for (uint32_t i = 0; i < hdr[1]; i++) atomic_store(&ki->fold[i], blob[20 + hdr[1] * 4u + i]);
  ki->globals = calloc(ki->nglobals + 1, sizeof(char *));
  const char *p = (const char *)blob + 20 + hdr[1] * 5u, *end = (const char *)blob + n;
  for (uint32_t i = 0; ki->globals && i < ki->nglobals && p < end; i++) {
    ki->globals[i] = strdup(p);
    p += strlen(p) + 1;
  }
  return 1;
}


void apply_policy(kinfo *ki, const uint8_t *pol, ssize_t n) {   /* jit_lock held */
  if (!pol || n != 4 + (ssize_t)ki->nparams) return;
  uint32_t dims;
  memcpy(&dims, pol, 4);
  int same = dims == atomic_load(&ki->dims_in_key);
  for (uint32_t i = 0; same && i < ki->nparams; i++) same = pol[4 + i] == atomic_load(&ki->fold[i]);
  if (same) return;
  uint32_t g = atomic_load_explicit(&ki->gen, memory_order_relaxed);
  atomic_store_explicit(&ki->gen, g + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  for (uint32_t i = 0; i < ki->nparams; i++) atomic_store_explicit(&ki->fold[i], pol[4 + i], memory_order_relaxed);
  atomic_store_explicit(&ki->dims_in_key, dims, memory_order_relaxed);
  atomic_store_explicit(&ki->gen, g + 2, memory_order_release);
}

/* The launch's argument bytes, back to back, as the specializer reads them. */
size_t pack_args(kinfo *ki, void **params, uint8_t *out) {
  size_t off = 0;
  for (uint32_t i = 0; i < ki->nparams; off += ki->sizes[i], i++)
    if (out) memcpy(out + off, params[i], ki->sizes[i]);
  return off;
}

/* The launches defer() kept for the tracker: their records' bytes. jit_lock held. */
ssize_t deferred_bytes(kinfo *ki) { return (ssize_t)(ki->ndeferred * (PROTO_DEFER_HEAD + pack_args(ki, NULL, NULL))); }
static const char *deferred_of(kinfo *ki) { return ki->deferred ? (const char *)ki->deferred : ""; }   /* NULL: None */

uint8_t *py_kernel_info(const void *image, const char *name, gpu_arch arch, ssize_t *n) {
  int g = py.GILStateEnsure();
  uint8_t *blob =
      arch.name
          ? py_bytes(py.CallFunction(f_kernel_info, FMT_KERNEL_INFO_HIP, (unsigned long long)(uintptr_t)image, name, arch.name),
                     n)
          : py_bytes(py.CallFunction(f_kernel_info, FMT_KERNEL_INFO, (unsigned long long)(uintptr_t)image, name, arch.sm), n);
  py.GILStateRelease(g);
  return blob;
}

/* A launch with a key the table does not have: the value tracker sees it (after the launches
 * deferred before it) and answers the kernel's policy (u32 dims; u8 fold[nparams]), which may
 * now fold less. jit_lock held. */
void py_track(kinfo *ki, void **params, dim3 grid, dim3 block) {
  size_t n = pack_args(ki, params, NULL);
  uint8_t *args = malloc(n ? n : 1);
  if (!args) return;
  pack_args(ki, params, args);
  int g = py.GILStateEnsure();
  ssize_t npol = 0;
  uint8_t *pol = py_bytes(py.CallFunction(f_track, FMT_TRACK, ki->kid, (const char *)args, (ssize_t)n, grid.x, grid.y, grid.z,
                                          block.x, block.y, block.z, deferred_of(ki), deferred_bytes(ki)),
                          &npol);
  py.GILStateRelease(g);
  ki->ndeferred = 0;   /* the tracker has seen them, in order, before this launch */
  apply_policy(ki, pol, npol);
  free(pol);
  free(args);
}

/* The tracker sees the launches defer() kept, and the kernel's policy follows. The GIL and
 * jit_lock held. */
static void pass_deferred(kinfo *ki) {
  if (!ki->ndeferred) return;
  ssize_t npol = 0;
  uint8_t *pol =
      py_bytes(py.CallFunction(f_track_deferred, FMT_TRACK_DEFERRED, ki->kid, deferred_of(ki), deferred_bytes(ki)), &npol);
  ki->ndeferred = 0;
  apply_policy(ki, pol, npol);
  free(pol);
}

/* On a compile thread before it takes a job: one of the launches may make that job stale. The
 * GIL first, then jit_lock only if it is free: a Python app's launching thread holds the GIL
 * when it waits for jit_lock, so waiting for the GIL while holding jit_lock could deadlock.
 * Where jit_lock stays taken, the launches wait for the next drain or miss (the job then reads
 * an older policy). */
void py_drain_deferred(kinfo *ki) {
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

/* At exit: what no miss took to the tracker, for the report to count (a thread stopped inside a
 * miss keeps jit_lock: then nothing). */
void py_drain_all_deferred(void) {
  if (!py_running()) return;
  int g = py.GILStateEnsure();
  int locked = pthread_mutex_trylock(&jit_lock) == 0;
  for (kinfo *k = all_kernels; locked && k; k = k->next_all) pass_deferred(k);
  if (locked) pthread_mutex_unlock(&jit_lock);
  py.GILStateRelease(g);
}

/* runtime.miss (which passes the kernel's deferred launches to the tracker first) or
 * runtime.specialize, for a job, on the job's architecture. The GIL and jit_lock held. */
static uint8_t *call_job(int miss, job *j, int cached_only, ssize_t *n) {
  kinfo *ki = j->ki;
  const char *args = (const char *)j->args, *addrs = (const char *)j->addrs;
  ssize_t nargs = (ssize_t)j->nargs, naddrs = (ssize_t)(ki->nglobals * 8);
  dim3 g = j->grid, b = j->block;
  PyObject *r;
  if (miss && j->arch.name)
    r = py.CallFunction(f_miss, FMT_MISS_HIP, ki->kid, args, nargs, g.x, g.y, g.z, b.x, b.y, b.z, addrs, naddrs, j->arch.name,
                        j->gpu_ms, cached_only, deferred_of(ki), deferred_bytes(ki));
  else if (miss)
    r = py.CallFunction(f_miss, FMT_MISS, ki->kid, args, nargs, g.x, g.y, g.z, b.x, b.y, b.z, addrs, naddrs, j->arch.sm,
                        j->gpu_ms, cached_only, deferred_of(ki), deferred_bytes(ki));
  else if (j->arch.name)
    r = py.CallFunction(f_specialize, FMT_SPECIALIZE_HIP, ki->kid, args, nargs, g.x, g.y, g.z, b.x, b.y, b.z, addrs, naddrs,
                        j->arch.name, j->gpu_ms, cached_only);
  else
    r = py.CallFunction(f_specialize, FMT_SPECIALIZE, ki->kid, args, nargs, g.x, g.y, g.z, b.x, b.y, b.z, addrs, naddrs,
                        j->arch.sm, j->gpu_ms, cached_only);
  if (miss) ki->ndeferred = 0;   /* the tracker has seen them */
  return py_bytes(r, n);
}

/* runtime.miss's answer (protocol.h PROTO_MISS_*): the header, the policy, which is applied
 * here, then the image answer. */
void py_miss(job *j, int cached_only, py_answer *a, uint64_t *t) {
  memset(a, 0, sizeof *a);
  a->status = PROTO_MISS_ORIGINAL;   /* also for an exception (printed): the original runs */
  int g = py.GILStateEnsure();
  if (t) stage(MISS_GIL, t);
  ssize_t n = 0;
  uint8_t *ans = call_job(1, j, cached_only, &n);
  uint32_t npol = 0;
  if (ans && n >= PROTO_MISS_HEAD) {
    memcpy(&a->track_ns, ans + PROTO_MISS_TRACK_NS_AT, 4);
    memcpy(&npol, ans + PROTO_MISS_POLICY_LEN_AT, 4);
    if ((size_t)n >= PROTO_MISS_HEAD + (size_t)npol) {
      apply_policy(j->ki, ans + PROTO_MISS_HEAD, npol);
      a->status = ans[PROTO_MISS_STATUS_AT];
      a->image = ans + PROTO_MISS_HEAD + npol;
      a->nimage = (size_t)n - PROTO_MISS_HEAD - npol;
      a->buf = ans;
      ans = NULL;
    }
  }
  py.GILStateRelease(g);
  free(ans);
}

/* runtime.specialize's answer: the image answer, b"" where the variant needs compiling (with
 * cached_only), or None (the original runs). */
void py_specialize(job *j, int cached_only, py_answer *a, uint64_t *t) {
  memset(a, 0, sizeof *a);
  a->status = PROTO_MISS_ORIGINAL;
  int g = py.GILStateEnsure();
  if (t) stage(MISS_GIL, t);
  ssize_t n = 0;
  uint8_t *ans = call_job(0, j, cached_only, &n);
  py.GILStateRelease(g);
  if (ans) {
    a->status = PROTO_MISS_IMAGE;
    a->buf = ans;
    a->image = ans;
    a->nimage = (size_t)n;
  }
}

void py_load_failed(int kid, int error) {
  int g = py.GILStateEnsure();
  done_with(py.CallFunction(f_load_failed, FMT_LOAD_FAILED, kid, error));
  py.GILStateRelease(g);
}

void py_prepare_compiler(int sm) {
  int g = py.GILStateEnsure();
  done_with(py.CallFunction(f_prepare_compiler, FMT_PREPARE_COMPILER, sm));
  py.GILStateRelease(g);
}

/* Before any context (architecture 0: any will do), and ahead, so the run time may decline:
 * the app's last run compiled nothing. */
int py_prepare_compiler_ahead(void) {
  int g = py.GILStateEnsure();
  PyObject *r = py.CallFunction(f_prepare_compiler, FMT_PREPARE_COMPILER_AHEAD, 0, 1);
  int done = 1;
  if (r) {
    done = py.LongAsLongLong(r) != 0;
    py.DecRef(r);
  } else py.ErrPrint();
  py.GILStateRelease(g);
  return done;
}

uint8_t *py_warm_set(const uint64_t *images, int n, ssize_t *len) {
  int g = py.GILStateEnsure();
  uint8_t *blob =
      py_bytes(py.CallFunction(f_warm_set, FMT_WARM_SET, (const char *)images, (ssize_t)(n * PROTO_IMAGE_ADDRESS)), len);
  py.GILStateRelease(g);
  return blob;
}

void py_validate_skipped(int kid, uint32_t vid, const char *why) {
  int g = py.GILStateEnsure();
  done_with(py.CallFunction(f_validate_skipped, FMT_VALIDATE_SKIPPED, kid, (int)vid, why));
  py.GILStateRelease(g);
}

char *py_validate_refusal(int kid) {
  int g = py.GILStateEnsure();
  ssize_t n = 0;
  uint8_t *why = py_bytes(py.CallFunction(f_validate_refusal, FMT_VALIDATE_REFUSAL, kid), &n);
  py.GILStateRelease(g);
  char *text = why && n > 0 ? malloc((size_t)n + 1) : NULL;
  if (text) {
    memcpy(text, why, (size_t)n);
    text[n] = 0;
  }
  free(why);
  return text;
}

void py_checked(int kid, uint32_t vid, const char *verdict, const uint8_t *args, size_t nargs, int allocations, uint64_t size,
                double ms) {
  int g = py.GILStateEnsure();
  done_with(py.CallFunction(f_checked, FMT_CHECKED, kid, (int)vid, verdict, (const char *)args, (ssize_t)nargs, allocations,
                            (unsigned long long)size, ms));
  py.GILStateRelease(g);
}

/* 0: keep the variant; 1: deny the kernel (its variant's results differ, or the run time could
 * not tell); 2: the original's own results vary (runtime/validate.py validated). */
int py_validated(int kid, uint32_t vid, const uint8_t *args, size_t nargs, const uint8_t *ranges, size_t nranges,
                 const uint8_t *variant, const uint8_t *original, const uint8_t *shadow, size_t total, double ms) {
  int g = py.GILStateEnsure();
  PyObject *r =
      py.CallFunction(f_validated, FMT_VALIDATED, kid, (int)vid, (const char *)args, (ssize_t)nargs, (const char *)ranges,
                      (ssize_t)nranges, (const char *)variant, (ssize_t)total, (const char *)original, (ssize_t)total,
                      shadow ? (const char *)shadow : "", (ssize_t)(shadow ? total : 0), ms);
  long long verdict = r ? py.LongAsLongLong(r) : 1;
  done_with(r);
  py.GILStateRelease(g);
  return verdict == 0 || verdict == 2 ? (int)verdict : 1;
}

void py_finish(const uint8_t *counters, size_t n, const uint8_t *trials, size_t ntrials) {
  int g = py.GILStateEnsure();
  done_with(py.CallFunction(f_finish, FMT_FINISH, counters ? (const char *)counters : "", (ssize_t)n,
                            trials ? (const char *)trials : "", (ssize_t)ntrials));
  py.GILStateRelease(g);
}

int py_write_report(const char *path, const uint8_t *counters, size_t n, unsigned long long unknown,
                    const unsigned long long w[W_COUNT]) {
  _Static_assert(W_COUNT == 35, "FMT_WRITE_REPORT passes 35 figures: keep the call below in step");
  int g = py.GILStateEnsure();
  PyObject *r =
      py.CallFunction(f_write_report, FMT_WRITE_REPORT, path, (const char *)counters, (ssize_t)n, unknown, w[0], w[1], w[2], w[3],
                      w[4], w[5], w[6], w[7], w[8], w[9], w[10], w[11], w[12], w[13], w[14], w[15], w[16], w[17], w[18], w[19],
                      w[20], w[21], w[22], w[23], w[24], w[25], w[26], w[27], w[28], w[29], w[30], w[31], w[32], w[33], w[34]);
  int written = r != NULL;
  done_with(r);
  py.GILStateRelease(g);
  return written;
}
