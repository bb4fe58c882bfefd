/* The embedded interpreter: started from proteus-python.cfg (or the app's own), and every call
 * into proteus_rewrite.runtime, with the layouts and formats of shim/protocol.h. */
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

py_api py;
static PyObject *rt;              /* the proteus_rewrite.runtime module */
PyObject *f_warm_set, *f_kernel_info, *f_specialize, *f_track, *f_load_failed, *f_write_report, *f_prepare_compiler, *f_finish, *f_miss,
    *f_track_deferred, *f_validated, *f_validate_skipped, *f_validate_refusal;
int py_state;              /* 0 not tried, 1 ready, -1 unavailable */

char shim_dir[4096];

void find_shim_dir(void) {
  Dl_info info;
  if (dladdr((void *)find_shim_dir, &info) && info.dli_fname) {
    snprintf(shim_dir, sizeof shim_dir, "%s", info.dli_fname);
    char *slash = strrchr(shim_dir, '/');
    if (slash) *slash = 0; else strcpy(shim_dir, ".");
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
#define PYSYM(field, sym) if (!(*(void **)&py.field = real_dlsym(h, sym))) return -1
  PYSYM(IsInitialized, "Py_IsInitialized"); PYSYM(InitializeEx, "Py_InitializeEx");
  PYSYM(EvalSaveThread, "PyEval_SaveThread"); PYSYM(GILStateEnsure, "PyGILState_Ensure");
  PYSYM(GILStateRelease, "PyGILState_Release"); PYSYM(RunSimpleString, "PyRun_SimpleString");
  PYSYM(GILStateCheck, "PyGILState_Check");
  PYSYM(ImportModule, "PyImport_ImportModule"); PYSYM(GetAttrString, "PyObject_GetAttrString");
  /* '#' formats take Py_ssize_t lengths only in the _SizeT variant before Python 3.13 */
  if (!(*(void **)&py.CallFunction = real_dlsym(h, "_PyObject_CallFunction_SizeT"))) PYSYM(CallFunction, "PyObject_CallFunction");
  PYSYM(BytesAsStringAndSize, "PyBytes_AsStringAndSize");
  PYSYM(LongAsLongLong, "PyLong_AsLongLong"); PYSYM(ErrPrint, "PyErr_Print"); PYSYM(DecRef, "Py_DecRef");
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
      /* Without `site`: its .pth hooks ran at every start of every app (41 ms for one other
       * package's on the H100 host, of a 0.15 s start-up), and the sys.path recorded from the
       * Python that ran proteus-rewrite already holds every directory they add, this
       * package's own first (an editable install's finder is not needed). */
      int *no_site = real_dlsym(h, "Py_NoSiteFlag");
      if (no_site) *no_site = 1;
      py.InitializeEx(0);                     /* 0: leave the app's signal handlers alone */
      if (old_home) free(old_home); else unsetenv("PYTHONHOME");
      size_t cap = strlen(paths) * 2 + 256;
      char *code = malloc(cap);
      if (!code) return 0;
      /* The switch interval: a launching thread that needs the GIL (a miss asks the tracker and
       * the caches) while a compile thread runs Python can wait up to the default 5 ms for it,
       * at every miss. Our own interpreter only: a host Python keeps its setting. */
      int n = snprintf(code, cap, "import sys\nrecorded = r'''%s'''.splitlines()\n"
                                  "sys.path[:] = recorded + [p for p in sys.path if p not in recorded]\n"
                                  "sys.setswitchinterval(0.0002)\n", paths);
      int rc = (n > 0 && (size_t)n < cap) ? py.RunSimpleString(code) : -1;
      free(code);
      py.EvalSaveThread();                    /* release the GIL: every call takes it */
      if (rc != 0) { warn("setting up the embedded Python failed"); return 0; }
    }
  }
  int g = py.GILStateEnsure();
  rt = py.ImportModule("proteus_rewrite.runtime");
  int ok = 0;
  if (!rt) {
    py.ErrPrint();
    warn("cannot import proteus_rewrite.runtime; kernels run unspecialized");
  } else {
    int drv = 0;
    if (real_cuDriverGetVersion) real_cuDriverGetVersion(&drv);
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
    f_validated = py.GetAttrString(rt, CALL_VALIDATED);
    f_validate_skipped = py.GetAttrString(rt, CALL_VALIDATE_SKIPPED);
    f_validate_refusal = py.GetAttrString(rt, CALL_VALIDATE_REFUSAL);
    f_warm_set = py.GetAttrString(rt, CALL_WARM_SET);
    if (r && f_kernel_info && f_specialize && f_track && f_load_failed && f_write_report && f_prepare_compiler && f_finish && f_miss &&
        f_track_deferred && f_validated && f_validate_skipped && f_validate_refusal && f_warm_set) {
      ok = py.LongAsLongLong(r) == 1;   /* False: a bad setting, which init has reported in one line */
      py.DecRef(r);
    } else py.ErrPrint();
  }
  py.GILStateRelease(g);
  return ok;
}


/* Python call returning bytes (copied into *out, malloc'ed) or NULL for None/failure. */
uint8_t *py_bytes(PyObject *res, ssize_t *len) {
  if (!res) { py.ErrPrint(); return NULL; }
  uint8_t *out = NULL;
  char *buf; ssize_t n;
  if (res != py.None && py.BytesAsStringAndSize(res, &buf, &n) == 0 && (out = malloc(n ? n : 1))) {
    memcpy(out, buf, n);
    *len = n;
  }
  py.DecRef(res);
  return out;
}


/* Python's kernel_info reply: u32 kid, nparams, dims_in_key, nglobals, defer_max; u32 sizes[nparams];
 * u8 fold[nparams]; names\0... Returns 1 when it describes the kernel (which may then be
 * specialized), 0 for None or a malformed reply. */
int read_kernel_info(kinfo *ki, const uint8_t *blob, ssize_t n) {
  uint32_t hdr[5];
  if (!blob || n < 20) return 0;
  memcpy(hdr, blob, 20);
  if (hdr[1] > MAX_PARAMS || (size_t)n < 20 + hdr[1] * 5u) return 0;
  ki->kid = (int)hdr[0]; ki->nparams = hdr[1]; ki->nglobals = hdr[3]; ki->defer_max = hdr[4];
  atomic_store(&ki->dims_in_key, hdr[2]);
  memcpy(ki->sizes, blob + 20, hdr[1] * 4u);
  for (uint32_t i = 0; i < hdr[1]; i++) atomic_store(&ki->fold[i], blob[20 + hdr[1] * 4u + i]);
  ki->globals = calloc(ki->nglobals + 1, sizeof(char *));
  const char *p = (const char *)blob + 20 + hdr[1] * 5u, *end = (const char *)blob + n;
  for (uint32_t i = 0; ki->globals && i < ki->nglobals && p < end; i++) { ki->globals[i] = strdup(p); p += strlen(p) + 1; }
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
  for (uint32_t i = 0; i < ki->nparams; off += ki->sizes[i], i++) if (out) memcpy(out + off, params[i], ki->sizes[i]);
  return off;
}

/* The launches defer() kept for the tracker: their records' bytes. jit_lock held. */
ssize_t deferred_bytes(kinfo *ki) { return (ssize_t)(ki->ndeferred * (PROTO_DEFER_HEAD + pack_args(ki, NULL, NULL))); }
static const char *deferred_of(kinfo *ki) { return ki->deferred ? (const char *)ki->deferred : ""; }   /* NULL: None */

/* A launch with a key the table does not have: the value tracker sees it (after the launches
 * deferred before it) and answers the kernel's policy (u32 dims; u8 fold[nparams]), which may
 * now fold less. jit_lock held. */
void track(kinfo *ki, void **params, dim3 grid, dim3 block) {
  size_t n = pack_args(ki, params, NULL);
  uint8_t *args = malloc(n ? n : 1);
  if (!args) return;
  pack_args(ki, params, args);
  int g = py.GILStateEnsure();
  ssize_t npol = 0;
  uint8_t *pol = py_bytes(py.CallFunction(f_track, FMT_TRACK, ki->kid, (const char *)args, (ssize_t)n,
                                          grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                          deferred_of(ki), deferred_bytes(ki)), &npol);
  py.GILStateRelease(g);
  ki->ndeferred = 0;   /* the tracker has seen them, in order, before this launch */
  apply_policy(ki, pol, npol);
  free(pol);
  free(args);
}


/* runtime.specialize or runtime.miss, which take the same arguments: the job's launch (and,
 * for miss, the kernel's deferred launches, which the tracker sees first; jit_lock held). */
static uint8_t *call_job(PyObject *f, job *j, int cached_only, ssize_t *n) {
  int passes_deferred = f == f_miss;   /* (specialize's format leaves the last two arguments unread) */
  uint8_t *ans = py_bytes(py.CallFunction(f, passes_deferred ? FMT_MISS : FMT_SPECIALIZE, j->ki->kid,
                                          (const char *)j->args, (ssize_t)j->nargs,
                                          j->grid.x, j->grid.y, j->grid.z, j->block.x, j->block.y, j->block.z,
                                          (const char *)j->addrs, (ssize_t)(j->ki->nglobals * 8), j->arch, j->gpu_ms,
                                          cached_only, deferred_of(j->ki), deferred_bytes(j->ki)),
                          n);
  if (passes_deferred) j->ki->ndeferred = 0;
  return ans;
}

/* Load the variant of an answer (protocol.h: PROTO_IMAGE_HEAD, the entry point's name, the
 * image); *m: which of the kernel's variants it is, and whether to time it first (trial.c). */
CUfunction load_answer(kinfo *ki, const uint8_t *p, size_t n, answer_meta *m) {
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
  uint8_t *image = malloc(nimage);   /* a copy: the driver reads the ELF image's headers in place, aligned */
  if (!name || !image) { free(name); free(image); return NULL; }
  memcpy(image, p + PROTO_IMAGE_HEAD + nlen, nimage);
  CUfunction fn = load_image(ki, image, name);
  free(name);
  return fn;
}

/* Specialize and load one variant. The caller holds the GIL; the context is current. With
 * cached_only, only the caches are asked: *uncached is set when the variant needs compiling. */
CUfunction run_job(job *j, int cached_only, int *uncached, answer_meta *m) {
  ssize_t n = 0;
  uint8_t *ans = call_job(f_specialize, j, cached_only, &n);
  if (ans && n == 0 && uncached) *uncached = 1;   /* b"": not in any cache */
  CUfunction fn = ans && n ? load_answer(j->ki, ans, (size_t)n, m) : NULL;
  free(ans);
  return fn;
}

/* A miss's first request, one call (runtime.miss): the tracker sees the launch, then, unless
 * that changed the kernel's policy (*changed: the job's key is stale, nothing else was done),
 * as run_job. The caller holds the GIL; *track_ns: the tracker's share of the call. */
CUfunction miss_job(job *j, int cached_only, int *uncached, int *changed, uint64_t *track_ns, answer_meta *m) {
  kinfo *ki = j->ki;
  ssize_t n = 0;
  uint8_t *ans = call_job(f_miss, j, cached_only, &n);
  uint32_t tracked = 0, npol = 0;
  if (!ans || n < PROTO_MISS_HEAD) { free(ans); return NULL; }   /* (an exception: printed; runs the original) */
  memcpy(&tracked, ans + PROTO_MISS_TRACK_NS_AT, 4);
  memcpy(&npol, ans + PROTO_MISS_POLICY_LEN_AT, 4);
  *track_ns = tracked;
  if ((size_t)n < PROTO_MISS_HEAD + (size_t)npol) { free(ans); return NULL; }
  apply_policy(ki, ans + PROTO_MISS_HEAD, npol);
  int status = ans[PROTO_MISS_STATUS_AT];
  size_t off = PROTO_MISS_HEAD + npol, nimage = (size_t)n - off;
  if (status == PROTO_MISS_POLICY_CHANGED) *changed = 1;
  CUfunction fn = NULL;
  if (status == PROTO_MISS_IMAGE && nimage == 0 && uncached) *uncached = 1;   /* not in any cache */
  if (status == PROTO_MISS_IMAGE && nimage) fn = load_answer(ki, ans + off, nimage, m);
  free(ans);
  return fn;
}


/* The tracker sees the launches defer() kept, and the kernel's policy follows. The GIL and
 * jit_lock held. */
void pass_deferred(kinfo *ki) {
  if (!ki->ndeferred) return;
  ssize_t npol = 0;
  uint8_t *pol = py_bytes(py.CallFunction(f_track_deferred, FMT_TRACK_DEFERRED, ki->kid, deferred_of(ki), deferred_bytes(ki)), &npol);
  ki->ndeferred = 0;
  apply_policy(ki, pol, npol);
  free(pol);
}


/* Per kernel launched (or run by a graph node): i32 kid (-1: not specialized), u64 launches, hits, fallbacks, launch
 * errors, launches while compiling, launches captured, launches timing a variant, sampled GPU
 * ms x 1000, graph nodes given a variant, name\0 (protocol.COUNTERS). */
static uint8_t *counters(size_t *len) {
  size_t n = 0;
  for (kinfo *k = all_kernels; k; k = k->next_all) n++;
  uint8_t *buf = calloc(n + 1, PROTO_COUNTERS + 256);
  *len = 0;
  if (!buf) return NULL;
  for (kinfo *k = all_kernels; k; k = k->next_all) {
    if (!atomic_load(&k->launches) && !atomic_load(&k->graph_nodes)) continue;
    int32_t kid = atomic_load(&k->state) == K_ACTIVE ? k->kid : -1;
    uint64_t c[PROTO_COUNTERS_U64] = {atomic_load(&k->launches), atomic_load(&k->hits), atomic_load(&k->fallbacks), atomic_load(&k->launch_errors),
                     atomic_load(&k->pending_launches), atomic_load(&k->captured), atomic_load(&k->timing),
                     (uint64_t)(gpu_ms(k) * 1000.0), atomic_load(&k->graph_nodes)};
    memcpy(buf + *len, &kid, 4); memcpy(buf + *len + 4, c, sizeof c); *len += PROTO_COUNTERS;
    size_t nl = strnlen(k->name, 255);
    memcpy(buf + *len, k->name, nl); buf[*len + nl] = 0; *len += nl + 1;
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

/* At exit (lifecycle.c's destructor): runtime.finish (end-of-run trace lines, the next run's
 * guess whether it compiles), then PROTEUS_REPORT. */
void report_at_exit(void) {
  if (py_state > 0 && py.IsInitialized()) {
    int g = py.GILStateEnsure();
    int locked = pthread_mutex_trylock(&jit_lock) == 0;   /* (a thread stopped inside a miss keeps it) */
    for (kinfo *k = all_kernels; locked && k; k = k->next_all) pass_deferred(k);   /* what no miss took: the report counts it */
    if (locked) pthread_mutex_unlock(&jit_lock);
    size_t n = 0, nt = 0;
    uint8_t *c = counters(&n);   /* after pass_deferred: it may activate a kernel */
    uint8_t *t = trial_records(&nt);
    PyObject *r = py.CallFunction(f_finish, FMT_FINISH, c ? (const char *)c : "", (ssize_t)n, t ? (const char *)t : "", (ssize_t)nt);
    if (r) py.DecRef(r); else py.ErrPrint();
    free(c);
    free(t);
    py.GILStateRelease(g);
  }
  const char *path = getenv(ENV_REPORT);
  if (!path) return;
  const char *no_gpu = no_gpu_reason(0);
  if (!all_kernels && !no_gpu[0]) return;
  /* CLOCK_MONOTONIC, as a parent's clock reads it: where a run's time went, from exec to exit */
  unsigned long long timeline[4] = {atomic_load(&t_loaded_ns), atomic_load(&t_main_start_ns), atomic_load(&t_main_end_ns), now_ns()};
  size_t len = 0;
  uint8_t *buf = counters(&len);
  if (!buf) return;
  /* the figures in write_report's order (protocol.h's W_*, runtime/protocol.py WAIT_FIELDS) */
  unsigned long long w[W_COUNT] = {
      [W_PYTHON_START] = atomic_load(&t_python_ns), [W_MISSES] = atomic_load(&t_miss_ns),
      [W_MISS_COUNT] = atomic_load(&n_misses), [W_PREPARE_COMPILER] = atomic_load(&t_prepare_ns),
      [W_EXIT] = atomic_load(&t_exit_wait_ns), [W_PRESTART] = (unsigned long long)atomic_load(&pre_did),
      [W_COMPILING] = atomic_load(&t_await_ns), [W_COMPILING_COUNT] = atomic_load(&n_awaits),
      [W_LOCK] = atomic_load(&t_stage_ns[MISS_LOCK]), [W_RESOLVE] = atomic_load(&t_stage_ns[MISS_RESOLVE]),
      [W_TRACK] = atomic_load(&t_stage_ns[MISS_TRACK]), [W_SPECIALIZE] = atomic_load(&t_stage_ns[MISS_SPECIALIZE]),
      [W_QUEUE] = atomic_load(&t_stage_ns[MISS_QUEUE]), [W_GIL] = atomic_load(&t_stage_ns[MISS_GIL]),
      [W_LOAD] = atomic_load(&t_stage_ns[MISS_LOAD]),
      [W_COMPILING_CHECKS] = atomic_load(&t_check_ns), [W_COMPILING_CHECK_COUNT] = atomic_load(&n_checks),
      [W_APP_MAIN_CPU] = atomic_load(&t_main_cpu_ns), [W_COMPILE_THREADS_CPU] = atomic_load(&t_worker_cpu_ns),
      [W_PRESTART_CPU] = atomic_load(&t_prestart_cpu_ns), [W_DEFERRED_COUNT] = atomic_load(&n_deferred),
      [W_PRELOADED] = atomic_load(&n_preloaded),
      [W_SHIM_LOADED] = timeline[0], [W_MAIN_START] = timeline[1], [W_MAIN_END] = timeline[2], [W_REPORT] = timeline[3]};
  _Static_assert(W_COUNT == 26, "FMT_WRITE_REPORT passes 26 figures: keep the call below in step");
  int written = 0;
  int python = py_state > 0 && py.IsInitialized();   /* a host Python may already have finalized */
  if (python && !no_gpu[0]) {   /* (without a GPU nothing ran that Python would have more to say of) */
    int g = py.GILStateEnsure();
    PyObject *r = py.CallFunction(f_write_report, FMT_WRITE_REPORT, path, (const char *)buf, (ssize_t)len,
                                  (unsigned long long)atomic_load(&unknown_launches), w[0], w[1], w[2], w[3], w[4], w[5],
                                  w[6], w[7], w[8], w[9], w[10], w[11], w[12], w[13], w[14], w[15], w[16], w[17], w[18],
                                  w[19], w[20], w[21], w[22], w[23], w[24], w[25]);
    if (r) { py.DecRef(r); written = 1; } else py.ErrPrint();
    py.GILStateRelease(g);
  }
  if (!written) {   /* Python never started (nothing to compile, PROTEUS_DISABLE), has finalized, or no GPU: counters only */
    FILE *f = fopen(path, "w");
    if (f) {
      fprintf(f, "{\"pid\": %d, \"python\": %s, \"disabled\": %s, ", (int)getpid(), python ? "true" : "false",
              g_disable ? "true" : "false");
      if (no_gpu[0]) {
        fputs("\"no_gpu\": ", f);
        json_string(f, no_gpu);
        fputs(", ", f);
      }
      fprintf(f, "\"unknown_handle_launches\": %llu, "
                 "\"timeline_ns\": {\"shim_loaded\": %llu, \"main_start\": %llu, \"main_end\": %llu, \"report\": %llu}, \"kernels\": [",
              (unsigned long long)atomic_load(&unknown_launches), timeline[0], timeline[1], timeline[2], timeline[3]);
      const char *sep = "";
      for (size_t off = 0; off < len;) {
        uint64_t c[PROTO_COUNTERS_U64]; memcpy(c, buf + off + 4, sizeof c);
        const char *name = (const char *)buf + off + PROTO_COUNTERS;
        fprintf(f, "%s{\"name\": \"%s\", \"launches\": %llu, \"specialized_launches\": %llu, \"table_hits\": %llu, "
                   "\"fallback_launches\": %llu, \"launch_errors\": %llu, \"launches_while_compiling\": %llu, "
                   "\"launches_captured\": %llu, \"graph_nodes_specialized\": %llu}", sep, name,
                (unsigned long long)c[0], (unsigned long long)(c[0] - c[2] - c[3] - c[4] - c[5] - c[6]), (unsigned long long)c[1],
                (unsigned long long)(c[2] + c[3] + c[4] + c[6]), (unsigned long long)c[3], (unsigned long long)c[4],
                (unsigned long long)c[5], (unsigned long long)c[8]);
        sep = ", ";
        off += PROTO_COUNTERS + strlen(name) + 1;
      }
      fprintf(f, "]}\n");
      fclose(f);
    }
  }
  free(buf);
}

