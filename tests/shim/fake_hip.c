/* A fake HIP runtime for testing libproteus.so without an AMD GPU (tests/shim/test_hip_shim.py).
 *
 * Built at test time as libamdhip64.so.5, with the symbol versions ROCm 5.2's library has and
 * against ROCm's own hip_runtime_api.h (so its definitions have the real signatures and its
 * hipDeviceProp_t the real layout). The HIP sample apps run on it unchanged: memory is host
 * memory, and kernels are not executed, only recorded. Every call that matters for the shim
 * is logged, one line each, to $FAKE_HIP_LOG:
 *
 *   register_fatbin ID BYTES          __hipRegisterFatBinary (BYTES: the bundle's size)
 *   register_function ID NAME         __hipRegisterFunction
 *   register_var ID NAME SIZE         __hipRegisterVar
 *   unregister_fatbin ID              __hipUnregisterFatBinary
 *   launch NAME GX,GY,GZ BX,BY,BZ ARG1     hipLaunchKernel of a registered kernel (the original)
 *   module_load MID BYTES FILE THREAD hipModuleLoadData; FILE: a copy of the image, in $FAKE_HIP_DIR;
 *                                     THREAD: "main" (the app's main thread) or "other" (a compile thread)
 *   module_load_failed BYTES          (FAKE_HIP_FAIL contains "load")
 *   module_function MID NAME          hipModuleGetFunction
 *   module_launch MID NAME GX,GY,GZ BX,BY,BZ ARG1 STREAM   hipModuleLaunchKernel
 *   module_launch_failed MID NAME     (FAKE_HIP_FAIL contains "launch": every module launch fails)
 *   device_properties DEV             hipGetDeviceProperties
 *
 * Streams are idle (hipStreamQuery: hipSuccess) unless FAKE_HIP_BUSY=1, where every stream
 * always has work queued (hipErrorNotReady, which like any error stays the thread's last one);
 * no stream ever captures.
 *
 * ARG1: the first 4 bytes of argument 1, in hex (loop_count's trip count, for instance). Errors
 * are sticky, the strictest a runtime can be: a failing call sets the thread's last error, and
 * only hipGetLastError clears it, so an error the shim caused and left would reach the app.
 */
#define _GNU_SOURCE
#include <hip/hip_runtime_api.h>

#include <pthread.h>
#include <stdarg.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __thread hipError_t last_error = hipSuccess;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static hipError_t ret(hipError_t e) {
  if (e != hipSuccess) last_error = e;
  return e;
}

static int failing(const char *what) {
  const char *f = getenv("FAKE_HIP_FAIL");
  return f && strstr(f, what);
}

static void logline(const char *fmt, ...) {
  const char *path = getenv("FAKE_HIP_LOG");
  if (!path) return;
  pthread_mutex_lock(&lock);
  FILE *f = fopen(path, "a");
  if (f) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
  }
  pthread_mutex_unlock(&lock);
}

/* ------------------------------------------------------------------ images */

static size_t elf_size(const unsigned char *p) {
  uint64_t shoff, phoff;
  uint16_t phentsize, phnum, shentsize, shnum;
  memcpy(&phoff, p + 0x20, 8);
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&phentsize, p + 0x36, 2);
  memcpy(&phnum, p + 0x38, 2);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  size_t a = shoff + (size_t)shentsize * shnum, b = phoff + (size_t)phentsize * phnum;
  return a > b ? a : b;
}

static size_t bundle_size(const unsigned char *p) {
  uint64_t count, end = 32, pos = 32;
  memcpy(&count, p + 24, 8);
  for (uint64_t i = 0; i < count && i < 64; i++) {
    uint64_t off, size, idlen;
    memcpy(&off, p + pos, 8);
    memcpy(&size, p + pos + 8, 8);
    memcpy(&idlen, p + pos + 16, 8);
    pos += 24 + idlen;
    if (off + size > end) end = off + size;
  }
  return end > pos ? end : pos;
}

/* Bytes of a code object or an uncompressed offload bundle; 0 for anything else. */
static size_t image_size(const void *image) {
  const unsigned char *p = image;
  if (!p) return 0;
  if (!memcmp(p,
              "\x7f"
              "ELF",
              4))
    return elf_size(p);
  if (!memcmp(p, "__CLANG_OFFLOAD_BUNDLE__", 24)) return bundle_size(p);
  return 0;
}

/* ------------------------------------------------------------------ registration */

typedef struct {
  const void *binary;
  int id;
} fatbin;
typedef struct {
  const void *stub;
  char *name;
  int fatbin;
} function;
typedef struct {
  const void *host;
  char *name;
  size_t size;
  void *dev;
  int fatbin;
} variable;

static fatbin fatbins[64];
static function functions[1024];
static variable variables[256];
static int nfatbins, nfunctions, nvariables;

void **__hipRegisterFatBinary(const void *data) {
  const struct {
    unsigned magic, version;
    const void *binary;
    void *unused;
  } *w = data;
  if (!w || w->magic != 0x48495046u || nfatbins == 64) return NULL;
  fatbin *f = &fatbins[nfatbins];
  f->binary = w->binary;
  f->id = nfatbins++;
  logline("register_fatbin %d %zu", f->id, image_size(w->binary));
  return (void **)f;
}

void __hipRegisterFunction(void **modules, const void *hostFunction, char *deviceFunction, const char *deviceName,
                           unsigned int threadLimit, void *tid, void *bid, void *blockDim, void *gridDim, int *wSize) {
  (void)deviceFunction;
  (void)threadLimit;
  (void)tid;
  (void)bid;
  (void)blockDim;
  (void)gridDim;
  (void)wSize;
  if (nfunctions == 1024) return;
  function *fn = &functions[nfunctions++];
  fn->stub = hostFunction;
  fn->name = strdup(deviceName);
  fn->fatbin = ((fatbin *)modules)->id;
  logline("register_function %d %s", fn->fatbin, deviceName);
}

void __hipRegisterVar(void **modules, void *var, char *hostVar, char *deviceVar, int ext, size_t size, int constant, int global) {
  (void)hostVar;
  (void)ext;
  (void)constant;
  (void)global;
  if (nvariables == 256) return;
  variable *v = &variables[nvariables++];
  v->host = var;
  v->name = strdup(deviceVar);
  v->size = size;
  v->dev = calloc(1, size ? size : 1);
  v->fatbin = ((fatbin *)modules)->id;
  logline("register_var %d %s %zu", v->fatbin, deviceVar, size);
}

void __hipUnregisterFatBinary(void **modules) { logline("unregister_fatbin %d", ((fatbin *)modules)->id); }

/* ------------------------------------------------------------------ launches */

typedef struct {
  dim3 grid, block;
  size_t shmem;
  hipStream_t stream;
} config;
static __thread config configs[16];
static __thread int nconfigs;

hipError_t __hipPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, hipStream_t stream) {
  if (nconfigs == 16) return ret(hipErrorInvalidConfiguration);
  configs[nconfigs++] = (config){gridDim, blockDim, sharedMem, stream};
  return hipSuccess;
}

hipError_t __hipPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, hipStream_t *stream) {
  if (!nconfigs) return ret(hipErrorInvalidConfiguration);
  config c = configs[--nconfigs];
  *gridDim = c.grid;
  *blockDim = c.block;
  *sharedMem = c.shmem;
  *stream = c.stream;
  return hipSuccess;
}

static unsigned arg1(void **args) {
  unsigned v = 0;
  if (args && args[0] && args[1]) memcpy(&v, args[1], 4);
  return v;
}

static hipError_t launch(const char *what, const void *f, dim3 g, dim3 b, void **args) {
  for (int i = 0; i < nfunctions; i++)
    if (functions[i].stub == f) {
      logline("%s %s %u,%u,%u %u,%u,%u %08x", what, functions[i].name, g.x, g.y, g.z, b.x, b.y, b.z, arg1(args));
      return hipSuccess;
    }
  return ret(hipErrorInvalidDeviceFunction);
}

hipError_t hipLaunchKernel(const void *f, dim3 numBlocks, dim3 dimBlocks, void **args, size_t sharedMemBytes,
                           hipStream_t stream) {
  (void)sharedMemBytes;
  (void)stream;
  return launch("launch", f, numBlocks, dimBlocks, args);
}

hipError_t hipLaunchKernel_spt(const void *f, dim3 numBlocks, dim3 dimBlocks, void **args, size_t sharedMemBytes,
                               hipStream_t stream) {
  (void)sharedMemBytes;
  (void)stream;
  return launch("launch_spt", f, numBlocks, dimBlocks, args);
}

/* ------------------------------------------------------------------ modules */

typedef struct {
  int id;
  const unsigned char *image;
  size_t size;
} module;
typedef struct {
  module *mod;
  char *name;
} kernel;
static int nmodules;

static hipError_t load(hipModule_t *out, const void *image) {
  size_t size = image_size(image);
  if (!out || !size || failing("load")) {
    logline("module_load_failed %zu", size);
    return ret(hipErrorInvalidImage);
  }
  module *m = calloc(1, sizeof *m);
  pthread_mutex_lock(&lock);
  m->id = nmodules++;
  pthread_mutex_unlock(&lock);
  m->image = image;   /* kept, not copied: the shim must keep the bytes alive (as ROCm may need) */
  m->size = size;
  char path[4096] = "";
  const char *dir = getenv("FAKE_HIP_DIR");
  if (dir) {
    snprintf(path, sizeof path, "%s/module-%d.co", dir, m->id);
    FILE *f = fopen(path, "wb");
    if (f) {
      fwrite(image, 1, size, f);
      fclose(f);
    }
  }
  logline("module_load %d %zu %s %s", m->id, size, path, gettid() == getpid() ? "main" : "other");
  *out = (hipModule_t)m;
  return hipSuccess;
}

hipError_t hipModuleLoadData(hipModule_t *module, const void *image) { return load(module, image); }

hipError_t hipModuleLoadDataEx(hipModule_t *module, const void *image, unsigned int numOptions, hipJitOption *options,
                               void **optionValues) {
  (void)numOptions;
  (void)options;
  (void)optionValues;
  return load(module, image);
}

hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t hmod, const char *kname) {
  module *m = (module *)hmod;
  char kd[1024];
  snprintf(kd, sizeof kd, "%s.kd", kname);
  if (!m || !memmem(m->image, m->size, kd, strlen(kd) + 1)) return ret(hipErrorNotFound);
  kernel *k = calloc(1, sizeof *k);
  k->mod = m;
  k->name = strdup(kname);
  *function = (hipFunction_t)k;
  logline("module_function %d %s", m->id, kname);
  return hipSuccess;
}

hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                 unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, hipStream_t stream, void **kernelParams, void **extra) {
  (void)sharedMemBytes;
  (void)extra;
  kernel *k = (kernel *)f;
  if (!k) return ret(hipErrorInvalidResourceHandle);
  if (failing("launch")) {
    logline("module_launch_failed %d %s", k->mod->id, k->name);
    return ret(hipErrorLaunchFailure);
  }
  logline("module_launch %d %s %u,%u,%u %u,%u,%u %08x %p", k->mod->id, k->name, gridDimX, gridDimY, gridDimZ, blockDimX,
          blockDimY, blockDimZ, arg1(kernelParams), (void *)stream);
  return hipSuccess;
}

hipError_t hipModuleGetGlobal(hipDeviceptr_t *dptr, size_t *bytes, hipModule_t hmod, const char *name) {
  static float globals[64][64];
  static int nglobals;
  module *m = (module *)hmod;
  if (!m || !memmem(m->image, m->size, name, strlen(name) + 1) || nglobals == 64) return ret(hipErrorNotFound);
  *dptr = globals[nglobals++];
  *bytes = sizeof globals[0];
  return hipSuccess;
}

hipError_t hipModuleUnload(hipModule_t module) {
  (void)module;
  return hipSuccess;
}

/* ------------------------------------------------------------------ device, memory, errors */

hipError_t hipGetDevice(int *deviceId) {
  *deviceId = 0;
  return hipSuccess;
}

hipError_t hipGetDeviceCount(int *count) {
  *count = 1;
  return hipSuccess;
}

hipError_t hipSetDevice(int deviceId) { return deviceId == 0 ? hipSuccess : ret(hipErrorInvalidDevice); }

hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int deviceId) {
  if (deviceId != 0) return ret(hipErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "Fake AMD GPU (proteus-rewrite tests)");
  const char *arch = getenv("FAKE_HIP_ARCH");
  snprintf(prop->gcnArchName, sizeof prop->gcnArchName, "%s", arch ? arch : "gfx90a:sramecc+:xnack-");
  prop->gcnArch = 910;
  prop->warpSize = 64;
  prop->maxThreadsPerBlock = 1024;
  logline("device_properties %d", deviceId);
  return hipSuccess;
}

hipError_t hipDriverGetVersion(int *v) {
  *v = 50221153;
  return hipSuccess;
}
hipError_t hipRuntimeGetVersion(int *v) {
  *v = 50221153;
  return hipSuccess;
}

hipError_t hipMalloc(void **ptr, size_t size) {
  *ptr = calloc(1, size ? size : 1);
  return *ptr ? hipSuccess : ret(hipErrorOutOfMemory);
}

hipError_t hipFree(void *ptr) {
  free(ptr);
  return hipSuccess;
}

hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind) {
  (void)kind;
  memmove(dst, src, sizeBytes);
  return hipSuccess;
}

hipError_t hipMemcpy_spt(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind) {
  return hipMemcpy(dst, src, sizeBytes, kind);
}

hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, void *src, size_t sizeBytes) {
  memmove(dst, src, sizeBytes);
  return hipSuccess;
}

hipError_t hipMemset(void *dst, int value, size_t sizeBytes) {
  memset(dst, value, sizeBytes);
  return hipSuccess;
}

static variable *var_of(const void *symbol) {
  for (int i = 0; i < nvariables; i++)
    if (variables[i].host == symbol) return &variables[i];
  return NULL;
}

hipError_t hipGetSymbolAddress(void **devPtr, const void *symbol) {
  variable *v = var_of(symbol);
  if (!v) return ret(hipErrorInvalidSymbol);
  *devPtr = v->dev;
  return hipSuccess;
}

hipError_t hipMemcpyToSymbol(const void *symbol, const void *src, size_t sizeBytes, size_t offset, hipMemcpyKind kind) {
  (void)kind;
  variable *v = var_of(symbol);
  if (!v || offset + sizeBytes > v->size) return ret(hipErrorInvalidSymbol);
  memcpy((char *)v->dev + offset, src, sizeBytes);
  return hipSuccess;
}

hipError_t hipMemcpyFromSymbol(void *dst, const void *symbol, size_t sizeBytes, size_t offset, hipMemcpyKind kind) {
  (void)kind;
  variable *v = var_of(symbol);
  if (!v || offset + sizeBytes > v->size) return ret(hipErrorInvalidSymbol);
  memcpy(dst, (char *)v->dev + offset, sizeBytes);
  return hipSuccess;
}

hipError_t hipDeviceSynchronize(void) { return hipSuccess; }

hipError_t hipStreamQuery(hipStream_t stream) {
  (void)stream;
  const char *busy = getenv("FAKE_HIP_BUSY");
  return busy && busy[0] == '1' ? ret(hipErrorNotReady) : hipSuccess;
}

hipError_t hipStreamIsCapturing(hipStream_t stream, hipStreamCaptureStatus *pCaptureStatus) {
  (void)stream;
  *pCaptureStatus = hipStreamCaptureStatusNone;
  return hipSuccess;
}

hipError_t hipGetLastError(void) {
  hipError_t e = last_error;
  last_error = hipSuccess;
  return e;
}

hipError_t hipPeekAtLastError(void) { return last_error; }

const char *hipGetErrorString(hipError_t hipError) {
  static __thread char buf[64];
  snprintf(buf, sizeof buf, "fake HIP error %d", (int)hipError);
  return buf;
}
