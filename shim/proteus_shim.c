/* libproteus.so: intercepts kernel launches and runs specialized kernels.
 *
 * Small on purpose: everything clever (which image and kernel a launch belongs to, what to
 * fold, compiling) lives in Python (proteus_rewrite.runtime), reached through an embedded
 * interpreter on a miss. This file only
 *   - learns which image and kernel name each launch handle belongs to, by wrapping the
 *     registration and loading calls of the CUDA runtime (dynamic cudart: interposed
 *     symbols) and of the driver (static cudart: every driver entry point comes from
 *     cuGetProcAddress, itself found with dlsym, so dlsym is interposed);
 *   - on each launch hashes the folded argument bytes and dimensions and looks the result
 *     up in a lock-free table (the hot path: no lock, no allocation, no Python);
 *   - on a miss asks Python for a cubin, loads it in the current context and remembers it.
 * Any failure launches the original kernel unchanged. PROTEUS_DISABLE=1 is a pure
 * pass-through. No CUDA headers are needed: the few driver types are declared in
 * proteus_shim.h, which also declares what the HIP half (proteus_hip.c) shares with this file.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proteus_shim.h"   /* the types, and what proteus_hip.c shares */

/* ------------------------------------------------------------------ configuration */

int g_disable = -1;         /* PROTEUS_DISABLE */
int g_trace_launch;          /* PROTEUS_TRACE_OUTPUT contains kernel-trace */

void read_env(void) {
  if (g_disable >= 0) return;
  const char *d = getenv("PROTEUS_DISABLE");
  const char *t = getenv("PROTEUS_TRACE_OUTPUT");
  g_trace_launch = t && strstr(t, "kernel-trace");
  g_disable = d && (d[0] == '1' || d[0] == 't' || d[0] == 'T' || d[0] == 'y');
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
static void *libcuda;

void init_real_dlsym(void) {
  if (real_dlsym) return;
  /* dlsym itself is interposed: reach glibc's through its versioned name. */
  static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
  for (int i = 0; versions[i] && !real_dlsym; i++)
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

static void *cuda_sym(const char *name) {
  init_real_dlsym();
  if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  return libcuda ? real_dlsym(libcuda, name) : NULL;
}

#define REAL(ret, name, params) static ret(*real_##name) params
REAL(CUresult, cuGetProcAddress, (const char *, void **, int, unsigned long long, int *));
REAL(CUresult, cuGetProcAddress_v2, (const char *, void **, int, unsigned long long, int *));
REAL(CUresult, cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **));
REAL(CUresult, cuLaunchKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **));
REAL(CUresult, cuLaunchKernelEx, (const CUlaunchConfig *, CUfunction, void **, void **));
REAL(CUresult, cuLaunchKernelEx_ptsz, (const CUlaunchConfig *, CUfunction, void **, void **));
REAL(CUresult, cuLaunchCooperativeKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **));
REAL(CUresult, cuLaunchCooperativeKernel_ptsz, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **));
REAL(CUresult, cuModuleLoadData, (CUmodule *, const void *));
REAL(CUresult, cuModuleLoadDataEx, (CUmodule *, const void *, unsigned, void *, void **));
REAL(CUresult, cuModuleLoadFatBinary, (CUmodule *, const void *));
REAL(CUresult, cuModuleGetFunction, (CUfunction *, CUmodule, const char *));
REAL(CUresult, cuModuleGetGlobal, (CUdeviceptr *, size_t *, CUmodule, const char *));
REAL(CUresult, cuLibraryLoadData, (CUlibrary *, const void *, void *, void **, unsigned, void *, void **, unsigned));
REAL(CUresult, cuLibraryGetKernel, (CUkernel *, CUlibrary, const char *));
REAL(CUresult, cuLibraryGetGlobal, (CUdeviceptr *, size_t *, CUlibrary, const char *));
REAL(CUresult, cuKernelGetFunction, (CUfunction *, CUkernel));
REAL(CUresult, cuModuleUnload, (CUmodule));
REAL(CUresult, cuLibraryUnload, (CUlibrary));
REAL(CUresult, cuCtxGetCurrent, (CUcontext *));
REAL(CUresult, cuCtxGetDevice, (CUdevice *));
REAL(CUresult, cuDeviceGetCount, (int *));
REAL(CUresult, cuDeviceGet, (CUdevice *, int));
REAL(CUresult, cuDeviceGetAttribute, (int *, int, CUdevice));
REAL(CUresult, cuDriverGetVersion, (int *));
REAL(CUresult, cuCtxSetCurrent, (CUcontext));
REAL(CUresult, cuEventCreate, (void **, unsigned));
REAL(CUresult, cuEventRecord, (void *, CUstream));
REAL(CUresult, cuEventQuery, (void *));
REAL(CUresult, cuEventElapsedTime, (float *, void *, void *));
REAL(CUresult, cuStreamIsCapturing, (CUstream, int *));
REAL(CUresult, cuStreamQuery, (CUstream));
REAL(void **, __cudaRegisterFatBinary, (void *));
REAL(void, __cudaRegisterFatBinaryEnd, (void **));
REAL(void, __cudaRegisterFunction, (void **, const char *, char *, const char *, int, void *, void *, void *, void *, int *));
REAL(void, __cudaRegisterVar, (void **, char *, char *, const char *, int, size_t, int, int));
REAL(cudaError_t, cudaLaunchKernel, (const void *, dim3, dim3, void **, size_t, void *));
REAL(cudaError_t, cudaLaunchKernel_ptsz, (const void *, dim3, dim3, void **, size_t, void *));
REAL(cudaError_t, cudaLaunchKernelExC, (const cudaLaunchConfig_t *, const void *, void **));
REAL(cudaError_t, cudaGetSymbolAddress, (void **, const void *));

/* Functions this file calls itself, straight from libcuda. */
/* Called on every launch of the driver-API and dynamic-runtime paths: once the driver's
 * launch is found, so is everything else this driver has, and a symbol it lacks stays NULL
 * rather than costing a dlopen and a dlsym on each launch. */
static _Atomic int driver_calls_loaded;
static void init_driver_calls(void) {
  if (atomic_load_explicit(&driver_calls_loaded, memory_order_acquire)) return;
#define LOAD(n) if (!real_##n) real_##n = cuda_sym(#n)
  LOAD(cuLaunchKernel); LOAD(cuLaunchKernel_ptsz); LOAD(cuLaunchKernelEx); LOAD(cuLaunchKernelEx_ptsz);
  LOAD(cuLaunchCooperativeKernel); LOAD(cuLaunchCooperativeKernel_ptsz);
  LOAD(cuModuleLoadData); LOAD(cuModuleGetFunction);
  if (!real_cuModuleGetGlobal) real_cuModuleGetGlobal = cuda_sym("cuModuleGetGlobal_v2");   /* size_t version */
  LOAD(cuLibraryGetGlobal); LOAD(cuCtxGetCurrent); LOAD(cuCtxGetDevice); LOAD(cuDeviceGetAttribute);
  LOAD(cuDriverGetVersion); LOAD(cuCtxSetCurrent); LOAD(cuEventCreate); LOAD(cuEventRecord); LOAD(cuEventQuery);
  LOAD(cuEventElapsedTime); LOAD(cuStreamIsCapturing); LOAD(cuStreamQuery);
  LOAD(cuLibraryLoadData); LOAD(cuLibraryGetKernel); LOAD(cuKernelGetFunction); LOAD(cuDeviceGetCount); LOAD(cuDeviceGet);
#undef LOAD
  if (real_cuLaunchKernel) atomic_store_explicit(&driver_calls_loaded, 1, memory_order_release);
}

/* The runtime's own function, found on first use (these are only called when it is loaded). */
#define RUNTIME_REAL(n) (*({ if (!real_##n) *(void **)&real_##n = dlsym(RTLD_NEXT, #n); &real_##n; }))

/* ------------------------------------------------------------------ kernels and handles */

/* PROTEUS_ASYNC_COMPILATION: 0 compiles on the launching thread, 1 in the background, the
 * original kernel running until the variant is ready (both upstream's); auto (ours, the
 * default) in the background too, but a launch that asks again for a variant still compiling
 * waits for it. See README "Specialization policy". */
enum { ASYNC_OFF, ASYNC_ON, ASYNC_AUTO };

#define HSLOTS (1u << 16)
#define SSLOTS (1u << 16)
/* Launch handles, open addressing: the handle and its kernel in the slot itself, so a hit finds
 * the kernel in the one line it probes. A slot is claimed once (handle written last, with
 * release) and never emptied; a handle registered again gets its new kernel in place. */
typedef struct { _Atomic(const void *) handle; _Atomic(kinfo *) ki; } hslot;
static hslot handles[HSLOTS];
/* The module (or library) each slot's handle came from, read on misses only. The kernel's own
 * `owner` is the first one; a context that loads the same image again has its module, and its
 * device variables, of its own. */
static _Atomic(void *) handle_owners[HSLOTS];
static _Atomic(sentry *) variants[SSLOTS];
pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;   /* registration and inserts */
pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;   /* one compilation at a time */
static kinfo *all_kernels;
static var_reg *all_vars;
static _Atomic uint64_t n_variants;
_Atomic uint64_t unknown_launches;
_Atomic uint64_t t_python_ns, t_miss_ns, n_misses, t_prepare_ns, t_exit_wait_ns, t_await_ns, n_awaits;
static _Atomic uint64_t t_check_ns, n_checks;   /* await_variant's checks that did not wait */
static _Atomic uint64_t n_deferred;   /* misses handed to the value tracker later (defer) */
/* Where the CPU went (the report's threads_ms): the app's main() (wall and its thread's CPU,
 * where the shim wraps main), and the CPU of the shim's own threads. A cold run that is slower
 * than a warm one with no more counted waits shows here whether the app's thread did more work
 * (contention for its core) or waited outside the shim. */
static _Atomic uint64_t t_loaded_ns, t_main_start_ns, t_main_end_ns, t_main_cpu_ns, t_worker_cpu_ns, t_prestart_cpu_ns;
static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* Where the misses' time went (the report's miss_stages): waiting for the compile lock,
 * resolving a kernel (its first launch), the tracker, the caches or a compilation, queueing,
 * and, of the tracker and caches' time, waiting for the GIL (which a compile thread or the
 * prestart thread may hold). */
enum { MISS_LOCK, MISS_RESOLVE, MISS_TRACK, MISS_SPECIALIZE, MISS_QUEUE, MISS_GIL, MISS_STAGES };
static _Atomic uint64_t t_stage_ns[MISS_STAGES];
static void stage(int which, uint64_t *t) {
  uint64_t now = now_ns();
  atomic_fetch_add_explicit(&t_stage_ns[which], now - *t, memory_order_relaxed);
  *t = now;
}

uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}   /* handles never registered with us: reported */

static inline uint64_t mix64(uint64_t h) {
  h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ull; h ^= h >> 33;
  return h;
}

/* Every hit hashes its launch's key. A full mix64 per 8-byte word cost about 1 ns a byte (a
 * 220-byte key: 261 ns a hit, 97 ns with this hash and build_key's inline copies, on the build
 * machine: bench/results/hitpath-2026-11-23-vm-*.json); here each word costs one multiply and
 * one shift, on two independent lanes, and one mix64 at the end spreads the result. Each step
 * is a bijection of the lane, so keys of one length that differ anywhere reach the final mix
 * in different states. In-process only: nothing stores these hashes. */
static inline uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t h) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint64_t a = h, b = ~h, len = n;
  for (; n >= 16; p += 16, n -= 16) {
    uint64_t v, w;
    memcpy(&v, p, 8);
    memcpy(&w, p + 8, 8);
    a = (a ^ v) * k; a ^= a >> 29;
    b = (b ^ w) * k; b ^= b >> 29;
  }
  if (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    a = (a ^ v) * k; a ^= a >> 29;
    p += 8; n -= 8;
  }
  uint64_t tail = 0;
  memcpy(&tail, p, n);
  return mix64(a ^ (b * 0xc2b2ae3d27d4eb4full) ^ tail ^ (len << 56));
}

/* The slot holding h, or NULL. Lock-free. */
static inline hslot *find_handle(const void *h) {
  uint32_t i = (uint32_t)mix64((uint64_t)(uintptr_t)h) & (HSLOTS - 1);
  for (uint32_t n = 0; n < HSLOTS; n++, i = (i + 1) & (HSLOTS - 1)) {
    const void *k = atomic_load_explicit(&handles[i].handle, memory_order_acquire);
    if (k == h) return &handles[i];
    if (!k) return NULL;
  }
  return NULL;
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

static void handle_insert(const void *h, kinfo *ki, void *owner) {   /* caller holds reg_lock */
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

/* After a launch: bring back what the kernel's next hit reads, while the app works on. While
 * its variant compiles, the next launch runs the original through await_variant, which reads
 * the line of `unserved` too (a cold run's first thousands of launches). */
static inline void prefetch_hit(const void *h, kinfo *ki) {
  __builtin_prefetch(&handles[(uint32_t)mix64((uint64_t)(uintptr_t)h) & (HSLOTS - 1)]);
  if (!ki) return;
  __builtin_prefetch(ki);
  __builtin_prefetch(ki->fold);
  __builtin_prefetch(ki->sizes);
  sentry *e = atomic_load_explicit(&ki->last, memory_order_relaxed);
  if (e) {
    __builtin_prefetch(e);
    __builtin_prefetch((const char *)e + 64);
    if (!atomic_load_explicit(&e->fn, memory_order_relaxed)) __builtin_prefetch(&ki->unserved);   /* e: read by this launch */
  }
}

static kinfo *find_kernel(const void *image, const char *name) {
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
      ki->image = image; ki->name = strdup(name); ki->owner_kind = owner_kind; ki->owner = owner;
      ki->next_all = all_kernels; all_kernels = ki;
    }
  }
  if (ki) handle_insert(handle, ki, owner);
  pthread_mutex_unlock(&reg_lock);
}

/* Loaded images (modules/libraries -> the bytes they were loaded from). */
typedef struct image_reg { struct image_reg *next; void *owner; const void *image; } image_reg;
static image_reg *images;

void remember_image(void *owner, const void *image) {
  pthread_mutex_lock(&reg_lock);
  image_reg *r = malloc(sizeof *r);
  if (r) { r->owner = owner; r->image = image; r->next = images; images = r; }
  pthread_mutex_unlock(&reg_lock);
}

const void *image_of(void *owner) {
  const void *found = NULL;
  pthread_mutex_lock(&reg_lock);
  for (image_reg *r = images; r; r = r->next) if (r->owner == owner) { found = r->image; break; }
  pthread_mutex_unlock(&reg_lock);
  return found;
}

/* ------------------------------------------------------------------ embedded Python */

py_api py;
static PyObject *rt;              /* the proteus_rewrite.runtime module */
PyObject *f_kernel_info, *f_specialize, *f_track, *f_load_failed;
static PyObject *f_write_report, *f_prepare_compiler, *f_finish, *f_miss, *f_track_deferred;
static int py_state;              /* 0 not tried, 1 ready, -1 unavailable */

static char shim_dir[4096];

static void find_shim_dir(void) {
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
    PyObject *init = py.GetAttrString(rt, "init");
    PyObject *r = init ? py.CallFunction(init, "si", shim_dir, drv) : NULL;
    f_kernel_info = py.GetAttrString(rt, "kernel_info");
    f_specialize = py.GetAttrString(rt, "specialize");
    f_track = py.GetAttrString(rt, "track");
    f_load_failed = py.GetAttrString(rt, "load_failed");
    f_write_report = py.GetAttrString(rt, "write_report");
    f_prepare_compiler = py.GetAttrString(rt, "prepare_compiler");
    f_finish = py.GetAttrString(rt, "finish");
    f_miss = py.GetAttrString(rt, "miss");
    f_track_deferred = py.GetAttrString(rt, "track_deferred");
    if (r && f_kernel_info && f_specialize && f_track && f_load_failed && f_write_report && f_prepare_compiler && f_finish && f_miss &&
        f_track_deferred) {
      ok = py.LongAsLongLong(r) == 1;   /* False: a bad setting, which init has reported in one line */
      py.DecRef(r);
    } else py.ErrPrint();
  }
  py.GILStateRelease(g);
  return ok;
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
static pthread_mutex_t pre_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pre_cond = PTHREAD_COND_INITIALIZER;
enum { PRE_NONE, PRE_PYTHON, PRE_COMPILER, PRE_DONE };
static int pre_state;                 /* pre_lock */
static int exiting;                   /* pre_lock: before_exit() has run */
static int compiler_prepared;         /* pre_lock */
static int main_wrapped;              /* our __libc_start_main runs the app's main */
static _Atomic int pre_did;           /* for the report: bit 0 Python, bit 1 the compiler, started ahead */
static int current_arch(void);

/* The compiler warm-up, once, from whichever thread comes first (the prestart thread, a compile
 * thread, or the first compile request); a caller that finds it running waits for it. Counted
 * as the app's wait when an app thread runs it. */
static void prepare_compiler(int arch, int app_thread) {
  pthread_mutex_lock(&pre_lock);
  while (pre_state == PRE_COMPILER) pthread_cond_wait(&pre_cond, &pre_lock);
  int todo = !compiler_prepared;
  compiler_prepared = 1;
  pthread_mutex_unlock(&pre_lock);
  if (!todo) return;
  uint64_t t0 = now_ns();
  int g = py.GILStateEnsure();
  PyObject *r = py.CallFunction(f_prepare_compiler, "i", arch);
  if (r) py.DecRef(r); else py.ErrPrint();
  py.GILStateRelease(g);
  if (app_thread) atomic_fetch_add(&t_prepare_ns, now_ns() - t0);
}

static void *prestart_main(void *arg) {
  int cuda = arg != NULL;
  uint64_t c0 = thread_cpu_ns();
  if (cuda && !real_cuDriverGetVersion) *(void **)&real_cuDriverGetVersion = cuda_sym("cuDriverGetVersion");   /* needs no cuInit */
  pthread_mutex_lock(&jit_lock);
  int ok = python_ready();
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
    PyObject *r = py.CallFunction(f_prepare_compiler, "ii", 0, 1);
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
  return NULL;
}

static void register_atfork(void);

static int has_store(void) {
  const char *dir = getenv("PROTEUS_STORE_DIR");
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
  const char *p = getenv("PROTEUS_PRESTART");
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

static void stop_workers(void);

/* Before any exit handler: no new compiler work, and none left running (prestart, workers). */
static void before_exit(void) {
  pthread_mutex_lock(&pre_lock);
  exiting = 1;
  while (pre_state == PRE_COMPILER) pthread_cond_wait(&pre_cond, &pre_lock);
  pthread_mutex_unlock(&pre_lock);
  stop_workers();
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

static int current_arch(void) {
  CUdevice dev; int major = 0, minor = 0;
  if (!real_cuCtxGetDevice || real_cuCtxGetDevice(&dev) != CUDA_SUCCESS) return 0;
  real_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  real_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  return major * 10 + minor;
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

/* Whether a variant may serve every context (kinfo.ctx_free): the driver loads libraries and
 * takes a CUkernel at launch, and every GPU the process sees has one architecture, the one
 * variants are compiled for. Asked once, on the first kernel's resolution. jit_lock held. */
static int one_architecture(void) {
  static int known = -1;
  if (known >= 0) return known;
  known = 0;
  int count = 0, first = -1;
  if (!real_cuLibraryLoadData || !real_cuLibraryGetKernel || !real_cuKernelGetFunction || !real_cuDeviceGetCount ||
      !real_cuDeviceGet || !real_cuDeviceGetAttribute || real_cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 1)
    return known;
  for (int i = 0; i < count; i++) {
    CUdevice dev;
    int major = 0, minor = 0;
    if (real_cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
        real_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
        real_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS)
      return known;
    if (first < 0) first = major * 10 + minor;
    else if (first != major * 10 + minor) return known;
  }
  return known = 1;
}

/* First launch of a kernel: ask Python which recorded kernel it is. jit_lock held. */
static void resolve(kinfo *ki) {
  if (atomic_load(&ki->state) != K_UNRESOLVED) return;
  int state = K_DISABLED;
  if (python_ready()) {
    int g = py.GILStateEnsure();
    ssize_t n = 0;
    uint8_t *blob = py_bytes(py.CallFunction(f_kernel_info, "Ksi",
                                             (unsigned long long)(uintptr_t)ki->image, ki->name, current_arch()), &n);
    py.GILStateRelease(g);
    if (read_kernel_info(ki, blob, n)) {
      state = K_ACTIVE;
      ki->ctx_free = ki->nglobals == 0 && one_architecture();
      /* Events for sampling GPU time, made here (a miss) so the hit path never allocates them */
      CUcontext ctx = NULL;
      if (real_cuEventCreate && real_cuCtxGetCurrent && real_cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx &&
          real_cuEventCreate(&ki->ev[0], 0) == CUDA_SUCCESS && real_cuEventCreate(&ki->ev[1], 0) == CUDA_SUCCESS)
        ki->ev_ctx = ctx;
      else
        atomic_store(&ki->sample_state, SAMPLE_OFF);
    }
    free(blob);
  }
  atomic_store(&ki->state, state);
}

/* A device variable's address for a launch of `ki` through a handle from `owner` (its module
 * or library; NULL: the kernel's first). */
static CUdeviceptr global_address(kinfo *ki, void *owner, const char *name) {
  CUdeviceptr dptr = 0; size_t bytes = 0;
  if (!owner) owner = ki->owner;
  if (ki->owner_kind == OWNER_LIBRARY && real_cuLibraryGetGlobal) {
    if (real_cuLibraryGetGlobal(&dptr, &bytes, (CUlibrary)owner, name) == CUDA_SUCCESS) return dptr;
  } else if (ki->owner_kind == OWNER_MODULE && real_cuModuleGetGlobal) {
    if (real_cuModuleGetGlobal(&dptr, &bytes, (CUmodule)owner, name) == CUDA_SUCCESS) return dptr;
  } else if (ki->owner_kind == OWNER_RUNTIME) {
    for (var_reg *v = all_vars; v; v = v->next)
      if (v->fatbin == ki->owner && !strcmp(v->name, name)) {
        void *p = NULL;
        if (RUNTIME_REAL(cudaGetSymbolAddress) && real_cudaGetSymbolAddress(&p, v->host) == 0) return (CUdeviceptr)(uintptr_t)p;
      }
  }
  return 0;
}

/* ------------------------------------------------------------------ the launch path */

sentry *variant_lookup(uint64_t h, kinfo *ki, CUcontext ctx, const uint8_t *key, uint32_t len) {
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

/* The bytes that select a variant: the policy generation, folded arguments, then block and
 * grid when they matter. Returns the key length, or -1 when it does not fit (the kernel then
 * runs unspecialized). */
int build_key(kinfo *ki, void **params, dim3 grid, dim3 block, uint8_t *key, uint32_t gen) {
  uint32_t len = 4;
  memcpy(key, &gen, 4);
  for (uint32_t i = 0; i < ki->nparams; i++) {
    if (!atomic_load_explicit(&ki->fold[i], memory_order_relaxed)) continue;
    uint32_t size = ki->sizes[i];
    if (len + size > MAX_KEY - 24) return -1;
    /* fixed sizes copy inline, not through a libc call per argument */
    if (size == 4) memcpy(key + len, params[i], 4);
    else if (size == 8) memcpy(key + len, params[i], 8);
    else memcpy(key + len, params[i], size);
    len += size;
  }
  uint32_t dims = atomic_load_explicit(&ki->dims_in_key, memory_order_relaxed);
  if (dims & 1) { memcpy(key + len, &block, 12); len += 12; }
  if (dims & 2) { memcpy(key + len, &grid, 12); len += 12; }
  return (int)len;
}

/* build_key under the sequence lock, for the hit path: -2 when the policy changed meanwhile. */
int stable_key(kinfo *ki, void **params, dim3 grid, dim3 block, uint8_t *key) {
  uint32_t g = atomic_load_explicit(&ki->gen, memory_order_acquire);
  if (g & 1) return -2;
  int len = build_key(ki, params, grid, block, key, g);
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&ki->gen, memory_order_relaxed) == g ? len : -2;
}

uint64_t key_hash(const kinfo *ki, CUcontext ctx, const uint8_t *key, uint32_t len) {
  return hash_bytes(key, len, (uint64_t)(uintptr_t)ki ^ mix64((uint64_t)(uintptr_t)ctx));
}

/* Keys are short: compared in place, not through a call into libc. */
static inline int key_equal(const uint8_t *a, const uint8_t *b, uint32_t n) {
  for (; n >= 8; a += 8, b += 8, n -= 8) {
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    if (x != y) return 0;
  }
  for (; n; a++, b++, n--) if (*a != *b) return 0;
  return 1;
}

/* A launch asks for the variant its kernel's latest hit found first: a loop that launches one
 * variant over and over (every argument it changes unfolded) skips the hash and the table's line. */
sentry *find_variant(kinfo *ki, CUcontext ctx, const uint8_t *key, uint32_t len) {
  sentry *e = atomic_load_explicit(&ki->last, memory_order_acquire);
  if (e && e->ctx == ctx && e->keylen == len && key_equal(e->key, key, len)) return e;
  if ((e = variant_lookup(key_hash(ki, ctx, key, len), ki, ctx, key, len)))
    atomic_store_explicit(&ki->last, e, memory_order_release);
  return e;
}

static void apply_policy(kinfo *ki, const uint8_t *pol, ssize_t n) {   /* jit_lock held */
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
#define DEFER_HEAD 24   /* u32 grid[3], u32 block[3], then the arguments: runtime.DEFERRED */
static ssize_t deferred_bytes(kinfo *ki) { return (ssize_t)(ki->ndeferred * (DEFER_HEAD + pack_args(ki, NULL, NULL))); }
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
  uint8_t *pol = py_bytes(py.CallFunction(f_track, "iy#(III)(III)y#", ki->kid, (const char *)args, (ssize_t)n,
                                          grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                          deferred_of(ki), deferred_bytes(ki)), &npol);
  py.GILStateRelease(g);
  ki->ndeferred = 0;   /* the tracker has seen them, in order, before this launch */
  apply_policy(ki, pol, npol);
  free(pol);
  free(args);
}

/* Estimated GPU time the kernel has used so far: mean sampled time x launches. */
static double gpu_ms(kinfo *ki) {
  uint64_t n = atomic_load(&ki->samples);
  return n ? (double)atomic_load(&ki->sampled_ns) / (double)n * (double)atomic_load(&ki->launches) / 1e6 : 0.0;
}

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

static job *make_job(kinfo *ki, void *owner, CUcontext ctx, void **params, dim3 grid, dim3 block) {
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

static void free_job(job *j) { free(j->args); free(j->addrs); free(j); }

/* Load a variant's image (malloc'd; freed here): its function, or NULL (reported to Python). */
static CUfunction load_image(kinfo *ki, uint8_t *image) {
  CUfunction fn = NULL;
  const char *fault = getenv("PROTEUS_FAULT_INJECT");   /* tests only: see proteus_rewrite/faults.py */
  CUresult r = 200;   /* CUDA_ERROR_INVALID_IMAGE, also what the injected fault answers */
  if (fault && strstr(fault, "module-load")) {
    /* the driver refused it */
  } else if (ki->ctx_free) {
    /* A library, launched by its CUkernel in any context; getting its function here loads it
     * into this one now (the driver loads lazily), not on the launch that first uses it. */
    CUlibrary lib;
    CUkernel kern;
    r = real_cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
    if (r == CUDA_SUCCESS) {
      CUresult got = real_cuLibraryGetKernel(&kern, lib, ki->name);
      if (got == CUDA_SUCCESS) got = real_cuKernelGetFunction(&fn, kern);
      if (got == CUDA_SUCCESS) fn = (CUfunction)kern;
      else if (real_cuLibraryUnload) real_cuLibraryUnload(lib);
      r = got;
    }
  } else {
    CUmodule mod;
    r = real_cuModuleLoadData(&mod, image);
    if (r == CUDA_SUCCESS) {
      CUresult got = real_cuModuleGetFunction(&fn, mod, ki->name);
      if (got != CUDA_SUCCESS && real_cuModuleUnload) real_cuModuleUnload(mod);
      r = got;
    }
  }
  if (r != CUDA_SUCCESS) {
    fn = NULL;
    PyObject *res = py.CallFunction(f_load_failed, "ii", ki->kid, r);
    if (res) py.DecRef(res); else py.ErrPrint();
  }
  free(image);
  return fn;
}

/* runtime.specialize or runtime.miss, which take the same arguments: the job's launch (and,
 * for miss, the kernel's deferred launches, which the tracker sees first; jit_lock held). */
static uint8_t *call_job(PyObject *f, job *j, int cached_only, ssize_t *n) {
  int passes_deferred = f == f_miss;   /* (specialize's format leaves the last two arguments unread) */
  uint8_t *ans = py_bytes(py.CallFunction(f, passes_deferred ? "iy#(III)(III)y#idiy#" : "iy#(III)(III)y#idi", j->ki->kid,
                                          (const char *)j->args, (ssize_t)j->nargs,
                                          j->grid.x, j->grid.y, j->grid.z, j->block.x, j->block.y, j->block.z,
                                          (const char *)j->addrs, (ssize_t)(j->ki->nglobals * 8), j->arch, j->gpu_ms,
                                          cached_only, deferred_of(j->ki), deferred_bytes(j->ki)),
                          n);
  if (passes_deferred) j->ki->ndeferred = 0;
  return ans;
}

/* Specialize and load one variant. The caller holds the GIL; the context is current. With
 * cached_only, only the caches are asked: *uncached is set when the variant needs compiling. */
static CUfunction run_job(job *j, int cached_only, int *uncached) {
  kinfo *ki = j->ki;
  ssize_t n = 0;
  uint8_t *image = call_job(f_specialize, j, cached_only, &n);
  if (image && n == 0) {   /* b"": not in any cache */
    if (uncached) *uncached = 1;
    free(image);
    return NULL;
  }
  return image ? load_image(ki, image) : NULL;
}

/* A miss's first request, one call (runtime.miss): the tracker sees the launch, then, unless
 * that changed the kernel's policy (*changed: the job's key is stale, nothing else was done),
 * as run_job. The caller holds the GIL; *track_ns: the tracker's share of the call. */
static CUfunction miss_job(job *j, int cached_only, int *uncached, int *changed, uint64_t *track_ns) {
  kinfo *ki = j->ki;
  ssize_t n = 0;
  uint8_t *ans = call_job(f_miss, j, cached_only, &n);
  uint32_t tracked = 0, npol = 0;
  if (!ans || n < 9) { free(ans); return NULL; }   /* (an exception: printed; runs the original) */
  memcpy(&tracked, ans + 1, 4);
  memcpy(&npol, ans + 5, 4);
  *track_ns = tracked;
  if ((size_t)n < 9 + (size_t)npol) { free(ans); return NULL; }
  apply_policy(ki, ans + 9, npol);
  int status = ans[0];
  size_t off = 9 + npol, nimage = (size_t)n - off;
  if (status == 0) *changed = 1;                         /* MISS_POLICY_CHANGED */
  if (status != 1) { free(ans); return NULL; }           /* MISS_ORIGINAL */
  if (nimage == 0) {                                      /* MISS_IMAGE, empty: not in any cache */
    if (uncached) *uncached = 1;
    free(ans);
    return NULL;
  }
  uint8_t *image = malloc(nimage);   /* a copy: the driver reads the ELF image's headers in place, aligned */
  if (image) memcpy(image, ans + off, nimage);
  free(ans);
  return image ? load_image(ki, image) : NULL;
}

/* ---- asynchronous compilation (PROTEUS_ASYNC_COMPILATION): a miss queues a job and runs
 * the original kernel; workers compile and publish the function into the pending entry. */
static int g_async = -1, g_async_threads = 1;
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static job *q_head, *q_tail;
static int q_stop, q_busy, q_workers;

/* The tracker sees the launches defer() kept, and the kernel's policy follows. The GIL and
 * jit_lock held. */
static void pass_deferred(kinfo *ki) {
  if (!ki->ndeferred) return;
  ssize_t npol = 0;
  uint8_t *pol = py_bytes(py.CallFunction(f_track_deferred, "iy#", ki->kid, deferred_of(ki), deferred_bytes(ki)), &npol);
  ki->ndeferred = 0;
  apply_policy(ki, pol, npol);
  free(pol);
}

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

static void *worker(void *arg) {
  (void)arg;
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
    int compiled = 0;
    uint64_t c0 = thread_cpu_ns();
    drain_deferred(j->ki);
    /* A job queued before the tracker changed the kernel's policy has a key no launch makes
     * any more: skip it, so the variant the launches now ask for is not stuck behind it. */
    if (j->gen == atomic_load(&j->ki->gen) && real_cuCtxSetCurrent(j->ctx) == CUDA_SUCCESS) {
      compiled = 1;
      prepare_compiler(j->arch, 0);   /* at once once done; see start_workers */
      int g = py.GILStateEnsure();
      fn = run_job(j, 0, NULL);
      py.GILStateRelease(g);
    }
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
static void stop_workers(void) {
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

static void read_async_env(void) {   /* jit_lock held */
  if (g_async >= 0) return;
  const char *raw = getenv("PROTEUS_ASYNC_COMPILATION"), *t = getenv("PROTEUS_ASYNC_THREADS");
  char a[16] = "";   /* as config.py reads it (which refuses anything else): blanks around ignored */
  if (raw) {
    while (*raw == ' ' || *raw == '\t') raw++;
    size_t n = strcspn(raw, " \t");
    if (n < sizeof a) { memcpy(a, raw, n); a[n] = 0; }
  }
  g_async = !a[0] || !strcasecmp(a, "auto") ? ASYNC_AUTO
            : !strcasecmp(a, "1") || !strcasecmp(a, "true") || !strcasecmp(a, "yes") || !strcasecmp(a, "on") ? ASYNC_ON
            : ASYNC_OFF;
  g_async_threads = t && atoi(t) > 0 ? atoi(t) : 1;
  if (g_async_threads > 64) g_async_threads = 64;
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
  if (pre_state == PRE_PYTHON || pre_state == PRE_COMPILER) {
    pthread_mutex_t fresh_jit = PTHREAD_MUTEX_INITIALIZER, fresh_pre = PTHREAD_MUTEX_INITIALIZER;
    jit_lock = fresh_jit;
    pre_lock = fresh_pre;
    py_state = -1;
    pre_state = PRE_DONE;
  }
}

static void register_atfork(void) {
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

sentry *new_entry(kinfo *ki, CUcontext ctx, const uint8_t *key, int len, CUfunction fn, int pending) {
  /* on a line of its own: a hit reads the header and a short key in one */
  sentry *ne = aligned_alloc(64, (sizeof *ne + (size_t)len + 63) & ~(size_t)63);
  if (!ne) return NULL;
  ne->hash = key_hash(ki, ctx, key, len); ne->ki = ki; ne->ctx = ctx; ne->keylen = len;
  atomic_init(&ne->fn, fn); atomic_init(&ne->pending, pending);
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
  if (g_trace_launch) fprintf(stderr, "proteus: launch %s grid %u,%u,%u block %u,%u,%u\n", ki->name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
  return ki;
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
static CUfunction await_variant(kinfo *ki, sentry *e, CUstream stream) {
  if (g_async != ASYNC_AUTO) return NULL;
  if (atomic_exchange_explicit(&ki->unserved, e->hash, memory_order_relaxed) != e->hash) return NULL;
  uint32_t skip = atomic_load_explicit(&ki->check_skip, memory_order_relaxed);
  if (skip) {   /* racing threads may skip one more or one less: only how often the stream is asked */
    atomic_store_explicit(&ki->check_skip, skip - 1, memory_order_relaxed);
    return atomic_load_explicit(&e->fn, memory_order_acquire);
  }
  uint64_t t0 = now_ns();
  if (py.GILStateCheck && py.GILStateCheck()) return NULL;
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
static __attribute__((noinline)) CUfunction pick_compiling(kinfo *ki, sentry *e, CUstream stream, int asked_first) {
  CUfunction fn;
  if (!asked_first) {   /* the launch that asked for it runs the original */
    if ((fn = await_variant(ki, e, stream))) {
      atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
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

static CUfunction pick_miss(const void *handle, void **params, dim3 grid, dim3 block, CUstream stream, kinfo *ki,
                            CUcontext ctx, int ctx_free);

/* The specialized function for this launch, or NULL to run the original. A hit stays in this
 * function and what it inlines (the hit path: lock-free, no allocation, no Python); a miss or
 * a variant still compiling goes out of line, so the hit's code stays short and together. */
static CUfunction pick(const void *handle, void **params, dim3 grid, dim3 block, CUstream stream, kinfo **kio) {
  read_env();
  if (g_disable) return NULL;
  kinfo *ki = launched_kernel(handle, grid, block);
  *kio = ki;
  if (!ki) return NULL;
  int state = atomic_load_explicit(&ki->state, memory_order_acquire);
  CUcontext ctx = NULL;
  if (state == K_DISABLED || !params) goto original;
  /* A context-free kernel's hit needs no context: where there is none, the variant's launch
   * fails as the original's would, and the original runs and answers. */
  int ctx_free = state == K_ACTIVE && ki->ctx_free;
  if (!ctx_free && (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) goto original;
  if (state == K_ACTIVE) {   /* the hot path: key, last hit or probe, launch */
    uint8_t key[MAX_KEY];
    int len = stable_key(ki, params, grid, block, key);
    if (len == -1) goto original;
    sentry *e = len < 0 ? NULL : find_variant(ki, ctx, key, len);
    if (e) {
      CUfunction fn = atomic_load_explicit(&e->fn, memory_order_acquire);
      if (__builtin_expect(fn != NULL, 1)) {
        atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
        return fn;
      }
      if (atomic_load_explicit(&e->pending, memory_order_acquire)) return pick_compiling(ki, e, stream, 0);
      goto original;
    }
  }
  return pick_miss(handle, params, grid, block, stream, ki, ctx, ctx_free);
original:
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
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
static int defer(kinfo *ki, void **params, dim3 grid, dim3 block) {
  if (g_async == ASYNC_OFF || ki->ndeferred >= ki->defer_max || !atomic_load(&ki->jobs)) return 0;
  size_t size = DEFER_HEAD + pack_args(ki, NULL, NULL);
  if (!ki->deferred && !(ki->deferred = malloc(size * ki->defer_max))) return 0;
  uint8_t *r = ki->deferred + size * ki->ndeferred++;
  uint32_t dims[6] = {grid.x, grid.y, grid.z, block.x, block.y, block.z};
  memcpy(r, dims, DEFER_HEAD);
  pack_args(ki, params, r + DEFER_HEAD);
  atomic_fetch_add(&n_deferred, 1);
  return 1;
}

/* Miss: resolve the kernel (first launch), then compile here or queue it for a worker. */
static __attribute__((noinline, cold)) CUfunction pick_miss(const void *handle, void **params, dim3 grid, dim3 block,
                                                            CUstream stream, kinfo *ki, CUcontext ctx, int ctx_free) {
  uint8_t key[MAX_KEY];
  int len;
  CUfunction fn = NULL;
  sentry *compiling = NULL;
  if (ctx_free && (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) goto original;
  job *j = NULL;
  int asked_first = 0;
  uint64_t t0 = now_ns(), t = t0;
  pthread_mutex_lock(&jit_lock);
  stage(MISS_LOCK, &t);
  read_async_env();
  if (atomic_load(&ki->state) == K_UNRESOLVED) resolve(ki);
  stage(MISS_RESOLVE, &t);
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
        uint64_t track_ns = 0;
        int g = py.GILStateEnsure();
        stage(MISS_GIL, &t);
        fn = tracked ? run_job(j, background, &uncached) : miss_job(j, background, &uncached, &changed, &track_ns);
        py.GILStateRelease(g);
        uint64_t call_start = t;
        t = now_ns();   /* the call's time: the tracker's share, then the caches' (or a compilation's) */
        if (track_ns > t - call_start) track_ns = t - call_start;
        atomic_fetch_add_explicit(&t_stage_ns[MISS_TRACK], track_ns, memory_order_relaxed);
        atomic_fetch_add_explicit(&t_stage_ns[MISS_SPECIALIZE], t - call_start - track_ns, memory_order_relaxed);
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
          fn = run_job(j, 0, NULL);
          py.GILStateRelease(g);
        }
      }
      if (j) {
        free_job(j);
        sentry *ne = new_entry(ki, kctx, key, len, fn, 0);
        if (ne) variant_insert(ne);
      }
    }
  }
  pthread_mutex_unlock(&jit_lock);
  atomic_fetch_add(&t_miss_ns, now_ns() - t0);
  atomic_fetch_add(&n_misses, 1);
  if (fn) return fn;
  if (compiling) return pick_compiling(ki, compiling, stream, asked_first);
original:
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
  return NULL;
}

/* ---- GPU time samples: a pair of events around a few launches: the 2nd, then every 64th
 * until SAMPLES_DENSE samples, then every 4,096th. The budget multiplies their mean by the
 * launches, so a few samples give it; each costs two event records and a query or two, which
 * every 64th launch of a long run would keep paying for no better estimate. */
#define SAMPLES_DENSE 16
static inline int sample_begin(kinfo *ki, CUstream s) {
  if (!ki) return 0;
  uint64_t n = atomic_load_explicit(&ki->launches, memory_order_relaxed);
  if ((n & 63) != 2 || ((n & 4095) != 2 && atomic_load_explicit(&ki->samples, memory_order_relaxed) >= SAMPLES_DENSE)) return 0;
  int idle = SAMPLE_IDLE;
  if (!atomic_compare_exchange_strong(&ki->sample_state, &idle, SAMPLE_RECORDING)) return 0;
  CUcontext ctx = NULL;
  int capturing = 1;
  if (real_cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx == ki->ev_ctx &&
      real_cuStreamIsCapturing(s, &capturing) == CUDA_SUCCESS && !capturing &&   /* events would join a graph */
      real_cuEventRecord(ki->ev[0], s) == CUDA_SUCCESS)
    return 1;
  atomic_store(&ki->sample_state, SAMPLE_IDLE);
  return 0;
}

static inline void sample_end(kinfo *ki, CUstream s, int started) {
  if (!started) return;
  atomic_store(&ki->sample_state, real_cuEventRecord(ki->ev[1], s) == CUDA_SUCCESS ? SAMPLE_PENDING : SAMPLE_IDLE);
}

/* Collect a finished sample; called on later launches, never waits for the GPU. */
static inline void sample_poll(kinfo *ki) {
  if (!ki || atomic_load_explicit(&ki->sample_state, memory_order_acquire) != SAMPLE_PENDING) return;
  int pending = SAMPLE_PENDING;
  CUresult q = real_cuEventQuery(ki->ev[1]);
  if (q == 600 /* CUDA_ERROR_NOT_READY */) return;
  if (!atomic_compare_exchange_strong(&ki->sample_state, &pending, SAMPLE_RECORDING)) return;
  float ms = 0;
  if (q == CUDA_SUCCESS && real_cuEventElapsedTime(&ms, ki->ev[0], ki->ev[1]) == CUDA_SUCCESS && ms >= 0) {
    atomic_fetch_add(&ki->sampled_ns, (uint64_t)(ms * 1e6));
    atomic_fetch_add(&ki->samples, 1);
  }
  atomic_store(&ki->sample_state, q == CUDA_SUCCESS ? SAMPLE_IDLE : SAMPLE_OFF);
}

/* ------------------------------------------------------------------ driver API wrappers */

/* The specialized kernel did not launch (the original runs instead): counted for the report. */
void launch_error(const void *handle) {
  kinfo *ki = handle_lookup(handle);
  if (ki) atomic_fetch_add_explicit(&ki->launch_errors, 1, memory_order_relaxed);
}

/* Set while the runtime launches a kernel we left to it: its driver-level launch is then
 * the same launch, already decided, and passes straight through. */
static __thread int in_runtime_launch __attribute__((tls_model("initial-exec")));   /* read on every launch: no __tls_get_addr call */

static CUresult launch_with(CUresult (*real)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **),
                            CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, CUstream s, void **params, void **extra) {
  if (in_runtime_launch) return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  kinfo *ki = NULL;
  /* the per-thread default stream has a handle of its own for event records and queries */
  CUstream es = !s && real == real_cuLaunchKernel_ptsz ? (CUstream)0x2 : s;
  CUfunction sf = pick(f, params, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, es, &ki);
  sample_poll(ki);
  int sampled = sample_begin(ki, es);
  CUresult r = sf ? real(sf, gx, gy, gz, bx, by, bz, shmem, s, params, extra) : 1;
  if (sf && r != CUDA_SUCCESS) launch_error(f);
  if (r != CUDA_SUCCESS) r = real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
  sample_end(ki, es, sampled);
  prefetch_hit(f, ki);
  return r;
}

static CUresult w_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                 unsigned shmem, CUstream s, void **params, void **extra) {
  return launch_with(real_cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
static CUresult w_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                      unsigned shmem, CUstream s, void **params, void **extra) {
  return launch_with(real_cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

static CUresult launch_ex_with(CUresult (*real)(const CUlaunchConfig *, CUfunction, void **, void **),
                               const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  kinfo *ki = NULL;
  CUstream es = c && !c->hStream && real == real_cuLaunchKernelEx_ptsz ? (CUstream)0x2 : c ? c->hStream : NULL;
  CUfunction sf = c && !in_runtime_launch ? pick(f, params, (dim3){c->gridDimX, c->gridDimY, c->gridDimZ}, (dim3){c->blockDimX, c->blockDimY, c->blockDimZ}, es, &ki) : NULL;
  CUresult r = sf ? real(c, sf, params, extra) : 1;
  if (sf && r != CUDA_SUCCESS) launch_error(f);
  if (r != CUDA_SUCCESS) r = real(c, f, params, extra);
  prefetch_hit(f, ki);
  return r;
}
static CUresult w_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { return launch_ex_with(real_cuLaunchKernelEx, c, f, p, e); }
static CUresult w_cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { return launch_ex_with(real_cuLaunchKernelEx_ptsz, c, f, p, e); }

static CUresult coop_with(CUresult (*real)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **),
                          CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shmem, CUstream s, void **params) {
  kinfo *ki = NULL;
  CUstream es = !s && real == real_cuLaunchCooperativeKernel_ptsz ? (CUstream)0x2 : s;
  CUfunction sf = pick(f, params, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, es, &ki);
  CUresult r = sf ? real(sf, gx, gy, gz, bx, by, bz, shmem, s, params) : 1;
  if (sf && r != CUDA_SUCCESS) launch_error(f);
  if (r != CUDA_SUCCESS) r = real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
  prefetch_hit(f, ki);
  return r;
}
static CUresult w_cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                            unsigned shmem, CUstream s, void **params) {
  return coop_with(real_cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shmem, s, params);
}
static CUresult w_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                                 unsigned bz, unsigned shmem, CUstream s, void **params) {
  return coop_with(real_cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

static CUresult w_cuModuleLoadData(CUmodule *m, const void *image) {
  prestart(1);
  CUresult r = real_cuModuleLoadData(m, image);
  if (r == CUDA_SUCCESS) remember_image(*m, image);
  return r;
}
static CUresult w_cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *o, void **v) {
  prestart(1);
  CUresult r = real_cuModuleLoadDataEx(m, image, n, o, v);
  if (r == CUDA_SUCCESS) remember_image(*m, image);
  return r;
}
static CUresult w_cuModuleLoadFatBinary(CUmodule *m, const void *image) {
  prestart(1);
  CUresult r = real_cuModuleLoadFatBinary(m, image);
  if (r == CUDA_SUCCESS) remember_image(*m, image);
  return r;
}
static CUresult w_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  CUresult r = real_cuModuleGetFunction(f, m, name);
  if (r == CUDA_SUCCESS) remember(*f, image_of(m), name, OWNER_MODULE, m);
  return r;
}
static CUresult w_cuLibraryLoadData(CUlibrary *l, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv, unsigned nl) {
  prestart(1);
  CUresult r = real_cuLibraryLoadData(l, code, jo, jv, nj, lo, lv, nl);
  if (r == CUDA_SUCCESS) remember_image(*l, code);
  return r;
}
static CUresult w_cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) {
  CUresult r = real_cuLibraryGetKernel(k, l, name);
  if (r == CUDA_SUCCESS) remember(*k, image_of(l), name, OWNER_LIBRARY, l);
  return r;
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
static CUresult w_cuModuleUnload(CUmodule m) {
  forget_owner(m);
  return real_cuModuleUnload(m);
}
static CUresult w_cuLibraryUnload(CUlibrary l) {
  forget_owner(l);
  return real_cuLibraryUnload(l);
}
static CUresult w_cuKernelGetFunction(CUfunction *f, CUkernel k) {
  CUresult r = real_cuKernelGetFunction(f, k);
  kinfo *ki = r == CUDA_SUCCESS ? handle_lookup(k) : NULL;
  if (ki) { pthread_mutex_lock(&reg_lock); handle_insert(*f, ki, handle_owner(k)); pthread_mutex_unlock(&reg_lock); }
  return r;
}

/* Every entry point the driver hands out passes through here. */
static void *wrap_proc(const char *sym, void *real, unsigned long long flags) {
  int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
#define WRAP(name, w) if (!strcmp(sym, name)) { *(void **)&real_##w = real; return (void *)w_##w; }
  if (ptsz) {
    WRAP("cuLaunchKernel", cuLaunchKernel_ptsz); WRAP("cuLaunchKernelEx", cuLaunchKernelEx_ptsz);
    WRAP("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz);
  } else {
    WRAP("cuLaunchKernel", cuLaunchKernel); WRAP("cuLaunchKernelEx", cuLaunchKernelEx);
    WRAP("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel);
  }
  WRAP("cuModuleLoadData", cuModuleLoadData); WRAP("cuModuleLoadDataEx", cuModuleLoadDataEx);
  WRAP("cuModuleLoadFatBinary", cuModuleLoadFatBinary); WRAP("cuModuleGetFunction", cuModuleGetFunction);
  WRAP("cuLibraryLoadData", cuLibraryLoadData); WRAP("cuLibraryGetKernel", cuLibraryGetKernel);
  WRAP("cuKernelGetFunction", cuKernelGetFunction);
  WRAP("cuModuleUnload", cuModuleUnload); WRAP("cuLibraryUnload", cuLibraryUnload);
#undef WRAP
  if (!strcmp(sym, "cuModuleGetGlobal")) real_cuModuleGetGlobal = real;
  if (!strcmp(sym, "cuLibraryGetGlobal")) real_cuLibraryGetGlobal = real;
  return real;
}

static CUresult w_cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);
static CUresult w_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

static CUresult proc_with(CUresult (*real)(const char *, void **, int, unsigned long long, int *),
                          const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
  CUresult r = real(sym, pfn, ver, flags, status);
  if (r != CUDA_SUCCESS || !pfn || !*pfn || !sym) return r;
  init_driver_calls();
  read_env();
  if (!strcmp(sym, "cuGetProcAddress")) {
    /* The runtime asks for cuGetProcAddress itself and uses that from then on. */
    if (real_cuGetProcAddress_v2 == NULL) *(void **)&real_cuGetProcAddress_v2 = *pfn;
    *pfn = (void *)w_cuGetProcAddress_v2;
    return r;
  }
  if (!g_disable) *pfn = wrap_proc(sym, *pfn, flags);
  return r;
}
static CUresult w_cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
  return proc_with(real_cuGetProcAddress, sym, pfn, ver, flags, status);
}
static CUresult w_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
  return proc_with(real_cuGetProcAddress_v2, sym, pfn, ver, flags, status);
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
  init_real_dlsym();
  void *p = real_dlsym(handle, name);
  if (!p || name[0] != 'c' || strncmp(name, "cuGetProcAddress", 16)) return p;
  prestart(1);   /* a static CUDA runtime starting up: the context comes next */
  if (!strcmp(name, "cuGetProcAddress")) { *(void **)&real_cuGetProcAddress = p; return (void *)w_cuGetProcAddress; }
  if (!strcmp(name, "cuGetProcAddress_v2")) { *(void **)&real_cuGetProcAddress_v2 = p; return (void *)w_cuGetProcAddress_v2; }
  return p;
}

/* Apps linked against libcuda directly (driver API) reach these through the PLT. */
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shmem, CUstream s, void **params, void **extra) {
  init_driver_calls();
  return w_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
  init_driver_calls();
  return w_cuLaunchKernelEx(c, f, p, e);
}
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) { init_driver_calls(); return w_cuModuleLoadData(m, image); }
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *o, void **v) {
  init_driver_calls();
  if (!real_cuModuleLoadDataEx) real_cuModuleLoadDataEx = cuda_sym("cuModuleLoadDataEx");
  return w_cuModuleLoadDataEx(m, image, n, o, v);
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  init_driver_calls();
  return w_cuModuleGetFunction(f, m, name);
}
EXPORT CUresult cuModuleUnload(CUmodule m) {
  if (!real_cuModuleUnload) real_cuModuleUnload = cuda_sym("cuModuleUnload");
  return w_cuModuleUnload(m);
}

/* ------------------------------------------------------------------ runtime API wrappers (dynamic cudart) */

typedef struct { int magic, version; const void *data; void *filename_or_fatbins; } fatbin_wrapper;

EXPORT void **__cudaRegisterFatBinary(void *wrapper) {
  void **h = RUNTIME_REAL(__cudaRegisterFatBinary)(wrapper);
  if (h && wrapper) remember_image(h, ((fatbin_wrapper *)wrapper)->data);
  prestart(1);
  return h;
}
EXPORT void __cudaRegisterFatBinaryEnd(void **h) { RUNTIME_REAL(__cudaRegisterFatBinaryEnd)(h); }
EXPORT void __cudaRegisterFunction(void **h, const char *hostFun, char *deviceFun, const char *deviceName, int tl, void *tid,
                                   void *bid, void *bd, void *gd, int *ws) {
  RUNTIME_REAL(__cudaRegisterFunction)(h, hostFun, deviceFun, deviceName, tl, tid, bid, bd, gd, ws);
  remember(hostFun, image_of(h), deviceName, OWNER_RUNTIME, h);
}
EXPORT void __cudaRegisterVar(void **h, char *hostVar, char *deviceAddress, const char *deviceName, int ext, size_t size, int constant,
                              int global) {
  RUNTIME_REAL(__cudaRegisterVar)(h, hostVar, deviceAddress, deviceName, ext, size, constant, global);
  var_reg *v = malloc(sizeof *v);
  if (v) {
    v->fatbin = h; v->host = hostVar; v->name = strdup(deviceName);
    pthread_mutex_lock(&reg_lock); v->next = all_vars; all_vars = v; pthread_mutex_unlock(&reg_lock);
  }
}

static cudaError_t runtime_launch(cudaError_t (*real)(const void *, dim3, dim3, void **, size_t, void *),
                                  CUresult (*drv)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **),
                                  const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
  init_driver_calls();
  kinfo *ki = NULL;
  CUstream es = !stream && drv == real_cuLaunchKernel_ptsz ? (CUstream)0x2 : stream;
  CUfunction sf = drv ? pick(func, args, grid, block, es, &ki) : NULL;
  sample_poll(ki);
  int sampled = sample_begin(ki, es);
  if (sf) {
    if (drv(sf, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shmem, stream, args, NULL) == CUDA_SUCCESS) {
      sample_end(ki, es, sampled);
      prefetch_hit(func, ki);
      return 0;
    }
    launch_error(func);
  }
  in_runtime_launch = 1;
  cudaError_t r = real(func, grid, block, args, shmem, stream);
  in_runtime_launch = 0;
  sample_end(ki, es, sampled);
  prefetch_hit(func, ki);
  return r;
}
EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
  return runtime_launch(RUNTIME_REAL(cudaLaunchKernel), real_cuLaunchKernel, func, grid, block, args, shmem, stream);
}
EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
  return runtime_launch(RUNTIME_REAL(cudaLaunchKernel_ptsz), real_cuLaunchKernel_ptsz, func, grid, block, args, shmem, stream);
}
EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *func, void **args) {
  init_driver_calls();
  if (c && c->numAttrs == 0 && real_cuLaunchKernel) {   /* with attributes: leave it to the runtime */
    kinfo *ki = NULL;
    CUfunction sf = pick(func, args, c->gridDim, c->blockDim, c->stream, &ki);
    if (sf) {
      if (real_cuLaunchKernel(sf, c->gridDim.x, c->gridDim.y, c->gridDim.z, c->blockDim.x, c->blockDim.y, c->blockDim.z,
                              (unsigned)c->dynamicSmemBytes, c->stream, args, NULL) == CUDA_SUCCESS)
        return 0;
      launch_error(func);
    }
  }
  in_runtime_launch = 1;
  cudaError_t r = RUNTIME_REAL(cudaLaunchKernelExC)(c, func, args);
  in_runtime_launch = 0;
  return r;
}

/* ------------------------------------------------------------------ report at exit */

__attribute__((constructor)) static void proteus_init(void) {
  atomic_store(&t_loaded_ns, now_ns());
  find_shim_dir();
  read_env();
}

__attribute__((destructor)) static void proteus_fini(void) {
  if (py_state > 0 && py.IsInitialized()) {   /* the next run's guess whether it compiles: runtime.finish */
    int g = py.GILStateEnsure();
    int locked = pthread_mutex_trylock(&jit_lock) == 0;   /* (a thread stopped inside a miss keeps it) */
    for (kinfo *k = all_kernels; locked && k; k = k->next_all) pass_deferred(k);   /* what no miss took: the report counts it */
    if (locked) pthread_mutex_unlock(&jit_lock);
    PyObject *r = py.CallFunction(f_finish, NULL);
    if (r) py.DecRef(r); else py.ErrPrint();
    py.GILStateRelease(g);
  }
  const char *path = getenv("PROTEUS_REPORT");
  if (!path || !all_kernels) return;
  /* CLOCK_MONOTONIC, as a parent's clock reads it: where a run's time went, from exec to exit */
  unsigned long long timeline[4] = {atomic_load(&t_loaded_ns), atomic_load(&t_main_start_ns), atomic_load(&t_main_end_ns), now_ns()};
  /* per kernel: i32 kid (-1: not specialized), u64 launches, hits, fallbacks, launch errors,
   * launches while compiling, sampled GPU ms x 1000, name\0 */
  size_t n = 0;
  for (kinfo *k = all_kernels; k; k = k->next_all) n++;
  uint8_t *buf = calloc(n, 52 + 256);
  if (!buf) return;
  size_t len = 0;
  for (kinfo *k = all_kernels; k; k = k->next_all) {
    if (!atomic_load(&k->launches)) continue;
    int32_t kid = atomic_load(&k->state) == K_ACTIVE ? k->kid : -1;
    uint64_t c[6] = {atomic_load(&k->launches), atomic_load(&k->hits), atomic_load(&k->fallbacks), atomic_load(&k->launch_errors),
                     atomic_load(&k->pending_launches), (uint64_t)(gpu_ms(k) * 1000.0)};
    memcpy(buf + len, &kid, 4); memcpy(buf + len + 4, c, 48); len += 52;
    size_t nl = strnlen(k->name, 255);
    memcpy(buf + len, k->name, nl); buf[len + nl] = 0; len += nl + 1;
  }
  int written = 0;
  if (py_state > 0 && py.IsInitialized()) {   /* a host Python may already have finalized */
    int g = py.GILStateEnsure();
    PyObject *r = py.CallFunction(f_write_report, "sy#K(KKKKKKKKKKKKKKKKKKKKKKKK)", path, (const char *)buf, (ssize_t)len,
                                  (unsigned long long)atomic_load(&unknown_launches),
                                  (unsigned long long)atomic_load(&t_python_ns), (unsigned long long)atomic_load(&t_miss_ns),
                                  (unsigned long long)atomic_load(&n_misses), (unsigned long long)atomic_load(&t_prepare_ns),
                                  (unsigned long long)atomic_load(&t_exit_wait_ns), (unsigned long long)atomic_load(&pre_did),
                                  (unsigned long long)atomic_load(&t_await_ns), (unsigned long long)atomic_load(&n_awaits),
                                  (unsigned long long)atomic_load(&t_stage_ns[MISS_LOCK]), (unsigned long long)atomic_load(&t_stage_ns[MISS_RESOLVE]),
                                  (unsigned long long)atomic_load(&t_stage_ns[MISS_TRACK]), (unsigned long long)atomic_load(&t_stage_ns[MISS_SPECIALIZE]),
                                  (unsigned long long)atomic_load(&t_stage_ns[MISS_QUEUE]), (unsigned long long)atomic_load(&t_stage_ns[MISS_GIL]),
                                  (unsigned long long)atomic_load(&t_check_ns), (unsigned long long)atomic_load(&n_checks),
                                  (unsigned long long)atomic_load(&t_main_cpu_ns),   /* runtime.WAIT_FIELDS, in order */
                                  (unsigned long long)atomic_load(&t_worker_cpu_ns), (unsigned long long)atomic_load(&t_prestart_cpu_ns),
                                  (unsigned long long)atomic_load(&n_deferred),
                                  timeline[0], timeline[1], timeline[2], timeline[3]);
    if (r) { py.DecRef(r); written = 1; } else py.ErrPrint();
    py.GILStateRelease(g);
  }
  if (!written) {   /* Python never started (nothing to compile, PROTEUS_DISABLE) or has finalized: counters only */
    FILE *f = fopen(path, "w");
    if (f) {
      fprintf(f, "{\"python\": false, \"disabled\": %s, \"unknown_handle_launches\": %llu, "
                 "\"timeline_ns\": {\"shim_loaded\": %llu, \"main_start\": %llu, \"main_end\": %llu, \"report\": %llu}, \"kernels\": [",
              g_disable ? "true" : "false", (unsigned long long)atomic_load(&unknown_launches),
              timeline[0], timeline[1], timeline[2], timeline[3]);
      const char *sep = "";
      for (size_t off = 0; off < len;) {
        uint64_t c[6]; memcpy(c, buf + off + 4, 48);
        const char *name = (const char *)buf + off + 52;
        fprintf(f, "%s{\"name\": \"%s\", \"launches\": %llu, \"specialized_launches\": %llu, \"table_hits\": %llu, "
                   "\"fallback_launches\": %llu, \"launch_errors\": %llu, \"launches_while_compiling\": %llu}", sep, name,
                (unsigned long long)c[0], (unsigned long long)(c[0] - c[2] - c[3] - c[4]), (unsigned long long)c[1],
                (unsigned long long)(c[2] + c[3] + c[4]), (unsigned long long)c[3], (unsigned long long)c[4]);
        sep = ", ";
        off += 52 + strlen(name) + 1;
      }
      fprintf(f, "]}\n");
      fclose(f);
    }
  }
  free(buf);
}
