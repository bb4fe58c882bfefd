/* libproteus.so, CUDA: the driver's and the runtime's entry points, wrapped, and CUDA's
 * `struct gpu_ops` (platform.h), through which the core reaches the driver.
 *
 * Learns which image and kernel name each launch handle belongs to, by wrapping the
 * registration and loading calls of the CUDA runtime (dynamic cudart: interposed symbols)
 * and of the driver (static cudart: every driver entry point comes from cuGetProcAddress,
 * itself found with dlsym, so dlsym is interposed); on each launch picks the variant through
 * the hit path (hitpath.h: no lock, no allocation, no Python), or the core's miss path
 * (jobs.c); any failure launches the original kernel unchanged. No CUDA headers: cuda_api.h
 * declares what is used. */
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

static void *libcuda;


void *cuda_sym(const char *name) {
  init_real_dlsym();
  if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (!libcuda) libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  return libcuda ? real_dlsym(libcuda, name) : NULL;
}


/* Functions this file calls itself, straight from libcuda. */
/* Called on every launch of the driver-API and dynamic-runtime paths: once the driver's
 * launch is found, so is everything else this driver has, and a symbol it lacks stays NULL
 * rather than costing a dlopen and a dlsym on each launch. */
#define PROTEUS_CUDA_DEFINE(ret, name, params) ret(*real_##name) params;
PROTEUS_CUDA_API(PROTEUS_CUDA_DEFINE)
#undef PROTEUS_CUDA_DEFINE

static _Atomic int driver_calls_loaded;
void init_driver_calls(void) {
  if (atomic_load_explicit(&driver_calls_loaded, memory_order_acquire)) return;
#define LOAD(n) \
  if (!real_##n) real_##n = cuda_sym(#n)
  LOAD(cuLaunchKernel);
  LOAD(cuLaunchKernel_ptsz);
  LOAD(cuLaunchKernelEx);
  LOAD(cuLaunchKernelEx_ptsz);
  LOAD(cuLaunchCooperativeKernel);
  LOAD(cuLaunchCooperativeKernel_ptsz);
  LOAD(cuModuleLoadData);
  LOAD(cuModuleGetFunction);
  if (!real_cuModuleGetGlobal) real_cuModuleGetGlobal = cuda_sym("cuModuleGetGlobal_v2");   /* size_t version */
  if (!real_cuEventDestroy) real_cuEventDestroy = cuda_sym("cuEventDestroy_v2");
  LOAD(cuLibraryGetGlobal);
  LOAD(cuCtxGetCurrent);
  LOAD(cuCtxGetDevice);
  LOAD(cuDeviceGetAttribute);
  LOAD(cuDriverGetVersion);
  LOAD(cuCtxSetCurrent);
  LOAD(cuEventCreate);
  LOAD(cuEventRecord);
  LOAD(cuEventQuery);
  LOAD(cuEventSynchronize);
  LOAD(cuEventElapsedTime);
  LOAD(cuStreamIsCapturing);
  LOAD(cuStreamQuery);
  LOAD(cuThreadExchangeStreamCaptureMode);
  LOAD(cuLibraryLoadData);
  LOAD(cuLibraryGetKernel);
  LOAD(cuKernelGetFunction);
  LOAD(cuDeviceGetCount);
  LOAD(cuDeviceGet);
  LOAD(cuFuncSetAttribute);
  LOAD(cuFuncSetCacheConfig);
  LOAD(cuKernelSetAttribute);
  LOAD(cuKernelSetCacheConfig);
  /* what cuda_graph.c calls itself, whether or not the app's graph calls come through it */
  LOAD(cuGraphGetNodes);
  LOAD(cuGraphNodeGetType);
  LOAD(cuGraphKernelNodeGetParams_v2);
  LOAD(cuGraphKernelNodeSetParams_v2);
  LOAD(cuGraphKernelNodeGetAttribute);
  LOAD(cuGraphClone);
  LOAD(cuGraphDestroy);
  LOAD(cuGraphExecKernelNodeSetParams_v2);
  LOAD(cuGraphExecNodeSetParams);
#undef LOAD
  if (real_cuLaunchKernel) atomic_store_explicit(&driver_calls_loaded, 1, memory_order_release);
}

/* Device variables the runtime registered (__cudaRegisterVar), for cuda_global_address. */
typedef struct var_reg {
  struct var_reg *next;
  const void *fatbin;
  const void *host;
  char *name;
} var_reg;
static var_reg *all_vars;   /* reg_lock */

/* ------------------------------------------------------------------ kernels and handles */

int current_arch(void) {
  CUdevice dev;
  int major = 0, minor = 0;
  if (!real_cuCtxGetDevice || real_cuCtxGetDevice(&dev) != CUDA_SUCCESS) return 0;
  real_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  real_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  return major * 10 + minor;
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

/* A kernel kernel_info described (cuda_ops.kernel_ready): whether its variants serve every
 * context, and the events its GPU-time samples use, made here (a miss) so that the hit path never
 * allocates them. jit_lock held. */
static void cuda_kernel_ready(kinfo *ki) {
  ki->ctx_free = ki->nglobals == 0 && one_architecture();
  CUcontext ctx = NULL;
  if (real_cuEventCreate && real_cuCtxGetCurrent && real_cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx &&
      real_cuEventCreate(&ki->ev[0], 0) == CUDA_SUCCESS && real_cuEventCreate(&ki->ev[1], 0) == CUDA_SUCCESS)
    ki->ev_ctx = ctx;
  else atomic_store(&ki->sample_state, SAMPLE_OFF);
}

/* A device variable's address for a launch of `ki` through a handle from `owner` (its module
 * or library; NULL: the kernel's first). */
uint64_t cuda_global_address(kinfo *ki, void *owner, const char *name) {
  CUdeviceptr dptr = 0;
  size_t bytes = 0;
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


/* cuda_ops.load: a variant's image (malloc'd; freed here: the driver keeps its own copy) loaded,
 * and its entry point `name` found: its function, or NULL with the driver's error. */
static gpu_fn cuda_load(kinfo *ki, uint8_t *image, const char *name, int *error) {
  CUfunction fn = NULL;
  CUresult r;
  if (ki->ctx_free) {
    /* A library, launched by its CUkernel in any context; getting its function here loads it
     * into this one now (the driver loads lazily), not on the launch that first uses it. */
    CUlibrary lib;
    CUkernel kern;
    r = real_cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
    if (r == CUDA_SUCCESS) {
      CUresult got = real_cuLibraryGetKernel(&kern, lib, name);
      if (got == CUDA_SUCCESS) got = real_cuKernelGetFunction(&fn, kern);
      if (got == CUDA_SUCCESS) fn = (CUfunction)kern;
      else if (real_cuLibraryUnload) real_cuLibraryUnload(lib);
      r = got;
    }
  } else {
    CUmodule mod;
    r = real_cuModuleLoadData(&mod, image);
    if (r == CUDA_SUCCESS) {
      CUresult got = real_cuModuleGetFunction(&fn, mod, name);
      if (got != CUDA_SUCCESS && real_cuModuleUnload) real_cuModuleUnload(mod);
      r = got;
    }
  }
  if (r == CUDA_SUCCESS) apply_attrs(ki, fn);
  else fn = NULL;
  *error = r;
  free(image);
  return fn;
}

static CUresult w_cuModuleLoadData(CUmodule *m, const void *image) {
  prestart(&cuda_ops);
  CUresult r = real_cuModuleLoadData(m, image);
  if (r == CUDA_SUCCESS) remember_image(*m, image);
  return r;
}
static CUresult w_cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *o, void **v) {
  prestart(&cuda_ops);
  CUresult r = real_cuModuleLoadDataEx(m, image, n, o, v);
  if (r == CUDA_SUCCESS) remember_image(*m, image);
  return r;
}
static CUresult w_cuModuleLoadFatBinary(CUmodule *m, const void *image) {
  prestart(&cuda_ops);
  CUresult r = real_cuModuleLoadFatBinary(m, image);
  if (r == CUDA_SUCCESS) remember_image(*m, image);
  return r;
}
static CUresult w_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  CUresult r = real_cuModuleGetFunction(f, m, name);
  if (r == CUDA_SUCCESS) remember(*f, image_of(m), name, OWNER_MODULE, m);
  return r;
}
static CUresult w_cuLibraryLoadData(CUlibrary *l, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv,
                                    unsigned nl) {
  prestart(&cuda_ops);
  CUresult r = real_cuLibraryLoadData(l, code, jo, jv, nj, lo, lv, nl);
  if (r == CUDA_SUCCESS) {
    remember_image(*l, code);
    warm_image(code);
  }
  return r;
}
static CUresult w_cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) {
  CUresult r = real_cuLibraryGetKernel(k, l, name);
  if (r == CUDA_SUCCESS) {
    remember(*k, image_of(l), name, OWNER_LIBRARY, l);
    graph_library_kernel(*k);
  }
  return r;
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
  if (ki) {
    pthread_mutex_lock(&reg_lock);
    handle_insert(*f, ki, handle_owner(k));
    pthread_mutex_unlock(&reg_lock);
  }
  return r;
}

/* ------------------------------------------------------------------ no usable GPU
 *
 * A static CUDA runtime that finds no driver, or whose cuInit fails, names no fat binary to the
 * shim: without this, the shim would know of no kernel and write no report, and `validate`
 * could not tell a run without a GPU from an app that failed. The runtime asks dlsym (or
 * cuGetProcAddress) for cuInit, so the app's own answer is seen, and named while the driver is
 * certainly still loaded. */
static pthread_mutex_t no_gpu_lock = PTHREAD_MUTEX_INITIALIZER;
static int app_init = -1;            /* no_gpu_lock: the app's cuInit, 0 once it succeeded; -1 never called */
static char init_error[160];         /* no_gpu_lock: the failure's name, as the driver gives it */

static CUresult w_cuInit(unsigned flags) {
  CUresult r = real_cuInit(flags);
  pthread_mutex_lock(&no_gpu_lock);
  if (r == CUDA_SUCCESS) app_init = 0;
  else if (app_init != 0) {
    const char *name = NULL;
    if (!real_cuGetErrorName) *(void **)&real_cuGetErrorName = cuda_sym("cuGetErrorName");
    if (!real_cuGetErrorName || real_cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "error";
    snprintf(init_error, sizeof init_error, "cuInit failed: %s (%d)", name, r);
    app_init = r;
  }
  pthread_mutex_unlock(&no_gpu_lock);
  return r;
}

/* Whether this process is a CUDA app: a kernel the CUDA runtime or driver named, else a fat
 * binary among its loaded objects (a program that is none, under LD_PRELOAD, writes no report). */
static int cuda_app(void) {
  for (kinfo *k = all_kernels; k; k = k->next_all)
    if (k->owner_kind != OWNER_HIP_RUNTIME && k->owner_kind != OWNER_HIP_MODULE) return 1;
  return !all_kernels && fatbins_seen() > 0;
}

static int launched_any(void) {
  for (kinfo *k = all_kernels; k; k = k->next_all)
    if (atomic_load(&k->launches) || atomic_load(&k->graph_nodes)) return 1;
  return 0;
}

const char *cuda_no_gpu_reason(int may_init) {
  static char why[512];
  static _Atomic int decided;
  read_env();
  if (atomic_load(&decided) || !getenv(ENV_REPORT) || g_disable || !cuda_app()) return why; /* (disabled: the report says so) */
  pthread_mutex_lock(&no_gpu_lock);
  int init = app_init;
  if (init > 0) snprintf(why, sizeof why, "%s", init_error);
  pthread_mutex_unlock(&no_gpu_lock);
  if (init >= 0) {
    atomic_store(&decided, 1);
    return why;
  }
  /* The app never asked through us: a driver-API app, or no driver to ask. */
  init_real_dlsym();
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h && !(h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))) {
    const char *e = dlerror();
    snprintf(why, sizeof why, "the CUDA driver cannot be loaded (%s)", e ? e : "libcuda.so.1");
    atomic_store(&decided, 1);
    return why;
  }
  /* Asked only where nothing was launched, and only before the exit handlers: after them a
   * driver the app loaded may be torn down already. */
  if (!may_init || launched_any()) return why;
  CUresult (*init_fn)(unsigned) = (CUresult(*)(unsigned))real_dlsym(h, "cuInit");
  CUresult (*name_of)(CUresult, const char **) = (CUresult(*)(CUresult, const char **))real_dlsym(h, "cuGetErrorName");
  CUresult r = init_fn ? init_fn(0) : CUDA_SUCCESS;
  const char *name = NULL;
  if (r != CUDA_SUCCESS && (!name_of || name_of(r, &name) != CUDA_SUCCESS || !name)) name = "error";
  if (r != CUDA_SUCCESS) snprintf(why, sizeof why, "cuInit failed: %s (%d)", name, r);
  atomic_store(&decided, 1);
  return why;
}


/* Every entry point the driver hands out passes through here. */
static void *wrap_proc(const char *sym, void *real, int ver, unsigned long long flags) {
  int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (ptsz) {
    WRAP_PROC("cuLaunchKernel", cuLaunchKernel_ptsz);
    WRAP_PROC("cuLaunchKernelEx", cuLaunchKernelEx_ptsz);
    WRAP_PROC("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz);
    WRAP_PROC("cuStreamBeginCapture", cuStreamBeginCapture_ptsz);
    WRAP_PROC("cuStreamBeginCaptureToGraph", cuStreamBeginCaptureToGraph_ptsz);
    WRAP_PROC("cuStreamEndCapture", cuStreamEndCapture_ptsz);
  } else {
    WRAP_PROC("cuLaunchKernel", cuLaunchKernel);
    WRAP_PROC("cuLaunchKernelEx", cuLaunchKernelEx);
    WRAP_PROC("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel);
    /* the runtime asks for the mode-taking version (CUDA >= 10.1): ours forwards the mode */
    WRAP_PROC("cuStreamBeginCapture", cuStreamBeginCapture_v2);
    WRAP_PROC("cuStreamBeginCaptureToGraph", cuStreamBeginCaptureToGraph);
    WRAP_PROC("cuStreamEndCapture", cuStreamEndCapture);
  }
  WRAP_PROC("cuModuleLoadData", cuModuleLoadData);
  WRAP_PROC("cuModuleLoadDataEx", cuModuleLoadDataEx);
  WRAP_PROC("cuModuleLoadFatBinary", cuModuleLoadFatBinary);
  WRAP_PROC("cuModuleGetFunction", cuModuleGetFunction);
  WRAP_PROC("cuLibraryLoadData", cuLibraryLoadData);
  WRAP_PROC("cuLibraryGetKernel", cuLibraryGetKernel);
  WRAP_PROC("cuKernelGetFunction", cuKernelGetFunction);
  WRAP_PROC("cuModuleUnload", cuModuleUnload);
  WRAP_PROC("cuLibraryUnload", cuLibraryUnload);
  WRAP_PROC("cuFuncSetAttribute", cuFuncSetAttribute);
  WRAP_PROC("cuFuncSetCacheConfig", cuFuncSetCacheConfig);
  WRAP_PROC("cuKernelSetAttribute", cuKernelSetAttribute);
  WRAP_PROC("cuKernelSetCacheConfig", cuKernelSetCacheConfig);
  WRAP_PROC("cuInit", cuInit);
  if (!strncmp(sym, "cuGraph", 7)) return graph_proc(sym, real, ver, ptsz);
  if (!strcmp(sym, "cuModuleGetGlobal")) real_cuModuleGetGlobal = real;
  if (!strcmp(sym, "cuLibraryGetGlobal")) real_cuLibraryGetGlobal = real;
  return real;
}

static CUresult w_cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);
static CUresult w_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

static CUresult proc_with(CUresult (*real)(const char *, void **, int, unsigned long long, int *), const char *sym, void **pfn,
                          int ver, unsigned long long flags, int *status) {
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
  if (!g_disable) *pfn = wrap_proc(sym, *pfn, ver, flags);
  return r;
}
static CUresult w_cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
  return proc_with(real_cuGetProcAddress, sym, pfn, ver, flags, status);
}
static CUresult w_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
  return proc_with(real_cuGetProcAddress_v2, sym, pfn, ver, flags, status);
}

EARLY __attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
  init_real_dlsym();
  void *p = real_dlsym(handle, name);
  if (!p || name[0] != 'c' || name[1] != 'u') return p;
  if (!strcmp(name, "cuInit")) {
    read_env();
    if (g_disable) return p;
    *(void **)&real_cuInit = p;
    return (void *)w_cuInit;
  }
  if (strncmp(name, "cuGetProcAddress", 16)) return p;
  prestart(&cuda_ops); /* a static CUDA runtime starting up: the context comes next */
  if (!strcmp(name, "cuGetProcAddress")) {
    *(void **)&real_cuGetProcAddress = p;
    return (void *)w_cuGetProcAddress;
  }
  if (!strcmp(name, "cuGetProcAddress_v2")) {
    *(void **)&real_cuGetProcAddress_v2 = p;
    return (void *)w_cuGetProcAddress_v2;
  }
  return p;
}

/* Apps linked against libcuda directly (driver API) reach these through the PLT (the launches:
 * cuda_launch.c). */
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
  init_driver_calls();
  if (!real_cuStreamBeginCapture_v2) real_cuStreamBeginCapture_v2 = cuda_sym("cuStreamBeginCapture_v2");
  return real_cuStreamBeginCapture_v2 ? w_cuStreamBeginCapture_v2(s, mode) : 999 /* CUDA_ERROR_UNKNOWN */;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, void **g) {
  init_driver_calls();
  if (!real_cuStreamEndCapture) real_cuStreamEndCapture = cuda_sym("cuStreamEndCapture");
  return real_cuStreamEndCapture ? w_cuStreamEndCapture(s, g) : 999;
}
EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
  init_driver_calls();
  return w_cuFuncSetAttribute(f, attrib, value);
}
EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, int config) {
  init_driver_calls();
  return w_cuFuncSetCacheConfig(f, config);
}
EXPORT CUresult cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev) {
  init_driver_calls();
  return w_cuKernelSetAttribute(attrib, value, k, dev);
}
EXPORT CUresult cuKernelSetCacheConfig(CUkernel k, int config, CUdevice dev) {
  init_driver_calls();
  return w_cuKernelSetCacheConfig(k, config, dev);
}
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  init_driver_calls();
  return w_cuModuleLoadData(m, image);
}
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

EXPORT void **__cudaRegisterFatBinary(void *wrapper) {
  void **h = RUNTIME_REAL(__cudaRegisterFatBinary)(wrapper);
  if (h && wrapper) {
    remember_image(h, ((fatbin_wrapper *)wrapper)->data);
    warm_image(((fatbin_wrapper *)wrapper)->data);
  }
  prestart(&cuda_ops);
  return h;
}
EXPORT void __cudaRegisterFatBinaryEnd(void **h) { RUNTIME_REAL(__cudaRegisterFatBinaryEnd)(h); }
EXPORT void __cudaRegisterFunction(void **h, const char *hostFun, char *deviceFun, const char *deviceName, int tl, void *tid,
                                   void *bid, void *bd, void *gd, int *ws) {
  RUNTIME_REAL(__cudaRegisterFunction)(h, hostFun, deviceFun, deviceName, tl, tid, bid, bd, gd, ws);
  remember(hostFun, image_of(h), deviceName, OWNER_RUNTIME, h);
}
EXPORT void __cudaRegisterVar(void **h, char *hostVar, char *deviceAddress, const char *deviceName, int ext, size_t size,
                              int constant, int global) {
  RUNTIME_REAL(__cudaRegisterVar)(h, hostVar, deviceAddress, deviceName, ext, size, constant, global);
  var_reg *v = malloc(sizeof *v);
  if (v) {
    v->fatbin = h;
    v->host = hostVar;
    v->name = strdup(deviceName);
    pthread_mutex_lock(&reg_lock);
    v->next = all_vars;
    all_vars = v;
    pthread_mutex_unlock(&reg_lock);
  }
}

/* The CUfunction behind a runtime handle (validation runs the original in its shadow); NULL
 * where the runtime does not say. */
/* ------------------------------------------------------------------ the platform: what the core asks of CUDA */

/* Found once (the prestart thread asks first, before it takes jit_lock: see prestart_main). */
static int cuda_driver_version(void) {
  if (!real_cuDriverGetVersion) *(void **)&real_cuDriverGetVersion = cuda_sym("cuDriverGetVersion"); /* needs no cuInit */
  int v = 0;
  if (real_cuDriverGetVersion) real_cuDriverGetVersion(&v);
  return v;
}

static int cuda_arch(gpu_arch *out) { /* 0 (no context) is asked about too: the run time decides */
  out->sm = current_arch();
  out->name = NULL;
  return 1;
}

static int cuda_current_context(gpu_ctx *ctx) { return real_cuCtxGetCurrent && real_cuCtxGetCurrent(ctx) == CUDA_SUCCESS; }
static int cuda_set_context(gpu_ctx ctx) { return real_cuCtxSetCurrent && real_cuCtxSetCurrent(ctx) == CUDA_SUCCESS; }

/* Whether the GPU still has work queued on the stream; a capturing stream is not asked (a query
 * would end the capture). */
static int cuda_stream_busy(gpu_stream s) {
  return cuda_capture_state(s) == 0 && real_cuStreamQuery && real_cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
}

static int cuda_event_create(void **ev) { return real_cuEventCreate && real_cuEventCreate(ev, 0) == CUDA_SUCCESS; }
static void cuda_event_destroy(void *ev) {
  if (real_cuEventDestroy) real_cuEventDestroy(ev);
}
static int cuda_event_record(void *ev, gpu_stream s) { return real_cuEventRecord && real_cuEventRecord(ev, s) == CUDA_SUCCESS; }
static int cuda_event_query(void *ev) {
  CUresult q = real_cuEventQuery ? real_cuEventQuery(ev) : 999 /* CUDA_ERROR_UNKNOWN */;
  return q == CUDA_SUCCESS ? EVENT_DONE : q == CUDA_ERROR_NOT_READY ? EVENT_PENDING : EVENT_FAILED;
}
static int cuda_event_elapsed(float *ms, void *start, void *end) {
  return real_cuEventElapsedTime && real_cuEventElapsedTime(ms, start, end) == CUDA_SUCCESS;
}
static void cuda_event_sync(void *ev) {
  if (real_cuEventSynchronize) real_cuEventSynchronize(ev);
}

const struct gpu_ops cuda_ops = {
    .name = "CUDA",
    .compiler_warm_up = 1,
    .driver_version = cuda_driver_version,
    .arch = cuda_arch,
    .kernel_ready = cuda_kernel_ready,
    .current_context = cuda_current_context,
    .set_context = cuda_set_context,
    .thread_init = relax_capture_mode,
    .global_address = cuda_global_address,
    .load = cuda_load,
    .stream_capturing = cuda_capture_state,
    .stream_busy = cuda_stream_busy,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_elapsed = cuda_event_elapsed,
    .event_sync = cuda_event_sync,
    .no_gpu_reason = cuda_no_gpu_reason,
    .preload = &cuda_preload,
    .checks = 1,
};

/* CUDA answers until a platform claims the process (platform.h): a static CUDA runtime that
 * found no driver reaches no entry point, and its report must still say why. A pointer stored,
 * nothing looked up or loaded. */
__attribute__((constructor)) static void cuda_until_claimed(void) { gpu_default(&cuda_ops); }
