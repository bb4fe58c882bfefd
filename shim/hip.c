/* libproteus.so, HIP: the HIP runtime's entry points, wrapped, and HIP's `struct gpu_ops`
 * (platform.h), through which the core reaches the runtime.
 *
 *   - learns which offload bundle and kernel name each launch handle is, by wrapping the
 *     registration calls clang emits into every HIP translation unit (__hipRegisterFatBinary,
 *     __hipRegisterFunction, __hipRegisterVar, __hipUnregisterFatBinary) and the module API
 *     (hipModuleLoadData/Ex, hipModuleGetFunction, hipModuleUnload);
 *   - on each launch (hipLaunchKernel, hipLaunchKernel_spt, hipModuleLaunchKernel) builds the
 *     key from the folded argument bytes and the block exactly as the CUDA path does, with the
 *     device in place of the context, and looks it up in the shared lock-free table (hitpath.h):
 *     a hit takes no lock, allocates nothing and never enters Python;
 *   - on a miss takes the core's miss path (jobs.c), the one CUDA takes: by default the variant
 *     compiles on a compile thread while the original kernel runs, and a later launch that asks
 *     for it again waits for it while its stream is busy (PROTEUS_ASYNC_COMPILATION; 0 compiles
 *     on the launching thread); launches are deferred for the value tracker, and the report is
 *     the core's. What the core asks of HIP is below: the device's processor as the
 *     architecture, a code object loaded with the real hipModuleLoadData/GetFunction (on a
 *     compile thread, after hipSetDevice), a stream asked with hipStreamQuery.
 * Anything that fails launches the original kernel unchanged. Not done for HIP
 * (docs/user/hip.md): GPU-time samples and speed trials (no events here: HIP kernels get the
 * compile budget's grace period only), loading a warm run's variants ahead, PROTEUS_VALIDATE,
 * hipExtModuleLaunchKernel, hipLaunchCooperativeKernel and hipExtLaunchKernel (they run the
 * original kernel, uncounted), and arguments passed through `extra` (run unspecialized). No HIP
 * headers (hip_api.h), and nothing of HIP is looked up or loaded until a HIP app calls one of
 * these functions: a CUDA app never loads anything HIP.
 */
#include "hip_api.h"
#include "hitpath.h"
#include "platform.h"
#include "shim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the real functions */

#define HIP_FN(ret, name, params) name##_fn real_##name;
PROTEUS_HIP_API(HIP_FN)
#undef HIP_FN

static void *hip_lib;

/* Only ever called from inside a HIP entry point, so libamdhip64 is already loaded: RTLD_NEXT
 * finds it, or a dlopen that loads nothing new (RTLD_NOLOAD). */
static void *hip_sym(const char *name) {
  init_real_dlsym();
  void *p = real_dlsym(RTLD_NEXT, name);
  if (p) return p;
  static const char *sonames[] = {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so.7", "libamdhip64.so", NULL};
  for (int i = 0; !hip_lib && sonames[i]; i++) hip_lib = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
  return hip_lib ? real_dlsym(hip_lib, name) : NULL;
}

/* The real function, found on first use (a benign race: every thread finds the same one). */
#define HIP_REAL(n) (real_##n ? real_##n : (*(void **)&real_##n = hip_sym(#n), real_##n))

/* Our own calls that fail leave the runtime's last error set, which the app would read as its
 * own (hipGetLastError after a launch). Clear it, unless the app already had one pending. */
static void clear_our_error(hipError_t before) {
  if (before == HIP_SUCCESS && HIP_REAL(hipGetLastError)) real_hipGetLastError();
}
static hipError_t pending_error(void) { return HIP_REAL(hipPeekAtLastError) ? real_hipPeekAtLastError() : HIP_SUCCESS; }

/* ------------------------------------------------------------------ registration */

typedef struct hip_var {
  struct hip_var *next;
  void **owner;
  const void *host;
  char *name;
} hip_var;
static hip_var *hip_vars;   /* reg_lock */

EXPORT void **__hipRegisterFatBinary(const void *data) {
  if (!HIP_REAL(__hipRegisterFatBinary)) return NULL;
  void **h = real___hipRegisterFatBinary(data);
  const hip_fatbin_wrapper *w = data;
  if (h && w && w->magic == HIP_FATBIN_MAGIC) remember_image(h, w->binary);
  prestart(&hip_ops);
  return h;
}

EXPORT void __hipRegisterFunction(void **modules, const void *hostFunction, char *deviceFunction, const char *deviceName,
                                  unsigned int threadLimit, void *tid, void *bid, void *blockDim, void *gridDim, int *wSize) {
  if (!HIP_REAL(__hipRegisterFunction)) return;
  real___hipRegisterFunction(modules, hostFunction, deviceFunction, deviceName, threadLimit, tid, bid, blockDim, gridDim, wSize);
  remember(hostFunction, image_of(modules), deviceName, OWNER_HIP_RUNTIME, modules);
}

EXPORT void __hipRegisterVar(void **modules, void *var, char *hostVar, char *deviceVar, int ext, size_t size, int constant,
                             int global) {
  if (!HIP_REAL(__hipRegisterVar)) return;
  real___hipRegisterVar(modules, var, hostVar, deviceVar, ext, size, constant, global);
  hip_var *v = malloc(sizeof *v);
  if (!v) return;
  v->owner = modules;
  v->host = var;
  v->name = strdup(deviceVar ? deviceVar : "");
  pthread_mutex_lock(&reg_lock);
  v->next = hip_vars;
  hip_vars = v;
  pthread_mutex_unlock(&reg_lock);
}

EXPORT void __hipUnregisterFatBinary(void **modules) {
  forget_owner(modules);
  pthread_mutex_lock(&reg_lock);
  for (hip_var *v = hip_vars; v; v = v->next)
    if (v->owner == modules) v->owner = NULL;
  pthread_mutex_unlock(&reg_lock);
  if (HIP_REAL(__hipUnregisterFatBinary)) real___hipUnregisterFatBinary(modules);
}

EXPORT hipError_t hipModuleLoadData(hipModule_t *module, const void *image) {
  gpu_claim(&hip_ops);
  if (!HIP_REAL(hipModuleLoadData)) return HIP_ERROR_INVALID_IMAGE;
  hipError_t r = real_hipModuleLoadData(module, image);
  if (r == HIP_SUCCESS && module) remember_image(*module, image);
  return r;
}

EXPORT hipError_t hipModuleLoadDataEx(hipModule_t *module, const void *image, unsigned int n, hipJitOption *o, void **v) {
  gpu_claim(&hip_ops);
  if (!HIP_REAL(hipModuleLoadDataEx)) return HIP_ERROR_INVALID_IMAGE;
  hipError_t r = real_hipModuleLoadDataEx(module, image, n, o, v);
  if (r == HIP_SUCCESS && module) remember_image(*module, image);
  return r;
}

EXPORT hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *kname) {
  if (!HIP_REAL(hipModuleGetFunction)) return HIP_ERROR_INVALID_IMAGE;
  hipError_t r = real_hipModuleGetFunction(function, module, kname);
  if (r == HIP_SUCCESS && function) remember(*function, image_of(module), kname, OWNER_HIP_MODULE, module);
  return r;
}

EXPORT hipError_t hipModuleUnload(hipModule_t module) {
  forget_owner(module);
  return HIP_REAL(hipModuleUnload) ? real_hipModuleUnload(module) : HIP_ERROR_INVALID_IMAGE;
}

/* ------------------------------------------------------------------ the device */

/* The processor name at the start of p ("gfx90a", "gfx90a:sramecc+:xnack-"), or 0. */
static int arch_at(const char *p, size_t room) {
  if (room < 5 || strncmp(p, "gfx", 3) != 0) return 0;
  size_t n = 3;
  while (n < room && ((p[n] >= '0' && p[n] <= '9') || (p[n] >= 'a' && p[n] <= 'z'))) n++;
  return n >= 5 && n < room && (p[n] == 0 || p[n] == ':') && memchr(p, 0, room) != NULL;
}

/* The device's gcnArchName out of a hipDeviceProp_t filled by the runtime: at its place in
 * ROCm 5's layout (hipDeviceProp_tR0000 in ROCm 6), else the first processor name anywhere in
 * the structure, whatever its layout. "" when there is none. */
void arch_from_props(const unsigned char *props, size_t size, char *out, size_t nout) {
  const char *p = (const char *)props;
  out[0] = 0;
  if (arch_at(p + HIP_GCN_ARCH_NAME_OFFSET, size - HIP_GCN_ARCH_NAME_OFFSET)) {
    snprintf(out, nout, "%.*s", (int)strnlen(p + HIP_GCN_ARCH_NAME_OFFSET, size - HIP_GCN_ARCH_NAME_OFFSET),
             p + HIP_GCN_ARCH_NAME_OFFSET);
    return;
  }
  for (size_t i = 0; i + 5 < size; i++)
    if ((i == 0 || p[i - 1] == 0) && arch_at(p + i, size - i)) {
      snprintf(out, nout, "%.*s", (int)strnlen(p + i, size - i), p + i);
      return;
    }
}

#define MAX_DEVICES 64
static char dev_arch[MAX_DEVICES][64];   /* jit_lock */

static const char *hip_arch(int dev) {   /* jit_lock held */
  if (dev < 0 || dev >= MAX_DEVICES) return "";
  if (dev_arch[dev][0]) return dev_arch[dev];
  /* ROCm 6 names ROCm 5's layout hipGetDevicePropertiesR0000; ROCm 5 has only the plain name */
  hipGetDeviceProperties_fn get = (hipGetDeviceProperties_fn)hip_sym("hipGetDevicePropertiesR0000");
  if (!get) get = HIP_REAL(hipGetDeviceProperties);
  static unsigned char props[16384];   /* larger than any layout: the runtime writes its own */
  memset(props, 0, sizeof props);
  hipError_t before = pending_error();
  if (!get || get((hipDeviceProp_t *)props, dev) != HIP_SUCCESS) {
    clear_our_error(before);
    return "";
  }
  arch_from_props(props, sizeof props, dev_arch[dev], sizeof dev_arch[dev]);
  return dev_arch[dev];
}

/* ------------------------------------------------------------------ what the core asks of HIP */

/* The device's processor; 0 (and a warning, once) where it cannot be told. jit_lock held. */
static int hip_device_arch(gpu_arch *out) {
  int dev = -1;
  out->sm = 0;
  out->name = "";
  if (!HIP_REAL(hipGetDevice) || real_hipGetDevice(&dev) != HIP_SUCCESS || dev < 0) return 0;
  out->name = hip_arch(dev);
  if (out->name[0]) return 1;
  static int warned;
  if (!warned++) warn("cannot tell the processor of HIP device %d (hipGetDeviceProperties); kernels run unspecialized", dev);
  return 0;
}

static void hip_kernel_ready(kinfo *ki) { /* no events here: no GPU-time samples */ atomic_store(&ki->sample_state, SAMPLE_OFF); }

/* The device (its ordinal + 1) stands for the context: HIP loads a module per device. */
static int hip_current_context(gpu_ctx *ctx) {
  int dev = -1;
  if (!HIP_REAL(hipGetDevice) || real_hipGetDevice(&dev) != HIP_SUCCESS || dev < 0) return 0;
  *ctx = (gpu_ctx)(uintptr_t)(dev + 1);
  return 1;
}

static int hip_set_context(gpu_ctx ctx) {   /* a compile thread's device, before it loads a job's variant */
  return ctx && HIP_REAL(hipSetDevice) && real_hipSetDevice((int)((uintptr_t)ctx - 1)) == HIP_SUCCESS;
}

/* A device variable's address for a launch through a handle of `owner` (the module it came
 * from: each device that loads the image has its own; NULL: the kernel's first). */
static uint64_t hip_global_address(kinfo *ki, void *owner, const char *name) {   /* jit_lock held */
  void *p = NULL;
  hipError_t before = pending_error();
  if (ki->owner_kind == OWNER_HIP_MODULE && HIP_REAL(hipModuleGetGlobal)) {
    size_t bytes = 0;
    if (real_hipModuleGetGlobal((hipDeviceptr_t *)&p, &bytes, (hipModule_t)(owner ? owner : ki->owner), name) == HIP_SUCCESS)
      return (uintptr_t)p;
    clear_our_error(before);
  } else if (ki->owner_kind == OWNER_HIP_RUNTIME && HIP_REAL(hipGetSymbolAddress)) {
    const void *host = NULL;
    pthread_mutex_lock(&reg_lock);
    for (hip_var *v = hip_vars; v; v = v->next)
      if (v->owner == ki->owner && !strcmp(v->name, name)) {
        host = v->host;
        break;
      }
    pthread_mutex_unlock(&reg_lock);
    if (host && real_hipGetSymbolAddress(&p, host) == HIP_SUCCESS) return (uintptr_t)p;
    if (host) clear_our_error(before);
  }
  return 0;
}

/* A code object loaded on the current device and its kernel `name` found. The module keeps the
 * image's bytes (ROCm may read them after hipModuleLoadData returns); a refused one is freed. */
static gpu_fn hip_load(kinfo *ki, uint8_t *image, const char *name, int *error) {
  (void)ki;
  hipModule_t mod = NULL;
  hipFunction_t fn = NULL;
  hipError_t before = pending_error();
  hipError_t r = HIP_REAL(hipModuleLoadData) ? real_hipModuleLoadData(&mod, image) : HIP_ERROR_INVALID_IMAGE;
  if (r == HIP_SUCCESS) {
    r = HIP_REAL(hipModuleGetFunction) ? real_hipModuleGetFunction(&fn, mod, name) : HIP_ERROR_INVALID_IMAGE;
    if (r != HIP_SUCCESS && HIP_REAL(hipModuleUnload)) real_hipModuleUnload(mod);
  }
  if (r == HIP_SUCCESS) return (gpu_fn)fn;
  clear_our_error(before);
  *error = r;
  free(image);
  return NULL;
}

/* 1 capturing (or the null stream while another captures), 0 not, -1 cannot be told. */
static int hip_capture_state(gpu_stream s) {
  if (!HIP_REAL(hipStreamIsCapturing)) return -1;
  hipStreamCaptureStatus status = 0;
  hipError_t before = pending_error();
  hipError_t r = real_hipStreamIsCapturing((hipStream_t)s, &status);
  if (r != HIP_SUCCESS) clear_our_error(before);
  if (r == HIP_ERROR_STREAM_CAPTURE_IMPLICIT) return 1;
  return r == HIP_SUCCESS ? status != 0 : -1;
}

/* Whether the device still has work queued on the stream. Not asked while it captures (a query
 * would end the capture); the query's "not ready" is not left for the app to find. */
static int hip_stream_busy(gpu_stream s) {
  if (hip_capture_state(s) != 0 || !HIP_REAL(hipStreamQuery)) return 0;
  hipError_t before = pending_error();
  hipError_t r = real_hipStreamQuery((hipStream_t)s);
  if (r != HIP_SUCCESS) clear_our_error(before);
  return r == HIP_ERROR_NOT_READY;
}

/* The run time warms up no AMDGPU compiler, so HIP asks for no warm-up; it has no events, loads
 * nothing ahead and has no report of its own for a missing GPU (platform.h). */
const struct gpu_ops hip_ops = {
    .name = "HIP",
    .arch = hip_device_arch,
    .kernel_ready = hip_kernel_ready,
    .current_context = hip_current_context,
    .set_context = hip_set_context,
    .global_address = hip_global_address,
    .load = hip_load,
    .stream_capturing = hip_capture_state,
    .stream_busy = hip_stream_busy,
};

/* ------------------------------------------------------------------ the launch path */

/* A miss, out of line: the core's miss path, where the process's platform is HIP (gpu_claim). */
__attribute__((noinline, cold)) static gpu_fn hip_miss(const void *handle, void **params, dim3 grid, dim3 block,
                                                       hipStream_t stream, kinfo *ki, gpu_ctx ctx) {
  if (gpu_claim(&hip_ops)) return pick_miss(handle, params, grid, block, (gpu_stream)stream, ki, ctx, 0);
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
  return NULL;
}

/* The specialized function for this launch, or NULL to run the original. The hit path is
 * CUDA's (hitpath.h), over the same tables, with the device (ordinal + 1) for the context; a
 * variant still compiling or a miss goes out of line to the core. */
hipFunction_t hip_pick(const void *handle, void **params, dim3 grid, dim3 block, hipStream_t stream) {
  read_env();
  if (g_disable) return NULL;
  kinfo *ki = launched_kernel(handle, grid, block);
  if (!ki) return NULL;
  int state = atomic_load_explicit(&ki->state, memory_order_acquire);
  int dev = -1;
  if (state == K_DISABLED || (!params && state == K_ACTIVE && ki->nparams) || !HIP_REAL(hipGetDevice) ||
      real_hipGetDevice(&dev) != HIP_SUCCESS || dev < 0)
    goto original;
  gpu_ctx ctx = (gpu_ctx)(uintptr_t)(dev + 1);
  if (state == K_ACTIVE) {   /* the hot path: hash, probe, launch */
    uint8_t key[MAX_KEY];
    int len = stable_key(ki, params, grid, block, key);
    if (len == -1) goto original;
    sentry *e = len < 0 ? NULL : find_variant(ki, ctx, key, len);
    if (e) {
      gpu_fn fn = atomic_load_explicit(&e->fn, memory_order_acquire);
      if (fn) {
        if (__builtin_expect(atomic_load_explicit(&e->trial, memory_order_relaxed) != NULL, 0)) {
          trial_ticket tk = {0};   /* (no turns without events: only its launches are counted) */
          return (hipFunction_t)trial_pick(ki, e, fn, &tk);
        }
        atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
        return (hipFunction_t)fn;
      }
      if (atomic_load_explicit(&e->pending, memory_order_acquire)) return (hipFunction_t)pick_compiling(ki, e, stream, 0);
      goto original;   /* a variant that failed: the original, from now on */
    }
  }
  return (hipFunction_t)hip_miss(handle, params, grid, block, stream, ki, ctx);
original:
  atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
  return NULL;
}

/* Set while the runtime runs a launch we left to it: a launch it makes of its own is then
 * part of the same one, already decided. */
static __thread int in_hip_launch;

/* A specialized launch that failed: counted, and its error not left for the app to find. */
static void hip_launch_failed(const void *handle) {
  launch_error(handle);
  clear_our_error(HIP_SUCCESS);
}

static hipError_t hip_launch_with(hipLaunchKernel_fn real, hipStream_t spt_stream, const void *f, dim3 grid, dim3 block,
                                  void **args, size_t shmem, hipStream_t stream) {
  if (!real) return HIP_ERROR_INVALID_IMAGE;
  if (in_hip_launch) return real(f, grid, block, args, shmem, stream);
  hipStream_t s = stream ? stream : spt_stream;   /* the per-thread default stream is a handle of its own */
  hipFunction_t sf = hip_pick(f, args, grid, block, s);
  if (sf && HIP_REAL(hipModuleLaunchKernel)) {
    if (real_hipModuleLaunchKernel(sf, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shmem, s, args, NULL) ==
        HIP_SUCCESS)
      return HIP_SUCCESS;
    hip_launch_failed(f);
  }
  in_hip_launch = 1;
  hipError_t r = real(f, grid, block, args, shmem, stream);
  in_hip_launch = 0;
  return r;
}

EXPORT hipError_t hipLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args,
                                  size_t sharedMemBytes, hipStream_t stream) {
  return hip_launch_with(HIP_REAL(hipLaunchKernel), NULL, function_address, numBlocks, dimBlocks, args, sharedMemBytes, stream);
}

EXPORT hipError_t hipLaunchKernel_spt(const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args,
                                      size_t sharedMemBytes, hipStream_t stream) {
  return hip_launch_with(HIP_REAL(hipLaunchKernel_spt), HIP_STREAM_PER_THREAD, function_address, numBlocks, dimBlocks, args,
                         sharedMemBytes, stream);
}

EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                        unsigned int by, unsigned int bz, unsigned int shmem, hipStream_t stream,
                                        void **kernelParams, void **extra) {
  if (!HIP_REAL(hipModuleLaunchKernel)) return HIP_ERROR_INVALID_IMAGE;
  if (in_hip_launch) return real_hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, kernelParams, extra);
  hipFunction_t sf = hip_pick(f, kernelParams, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, stream);
  if (sf) {
    if (real_hipModuleLaunchKernel(sf, gx, gy, gz, bx, by, bz, shmem, stream, kernelParams, extra) == HIP_SUCCESS)
      return HIP_SUCCESS;
    hip_launch_failed(f);
  }
  return real_hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, kernelParams, extra);
}

/* Every definition above has exactly the type hip_api.h lists (which the tests check
 * against ROCm's headers and clang's registration calls). */
#define SAME_TYPE(name) \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&name), name##_fn), #name " differs from hip_api.h");
// clang-format off
SAME_TYPE(__hipRegisterFatBinary)
SAME_TYPE(__hipRegisterFunction)
SAME_TYPE(__hipRegisterVar)
SAME_TYPE(__hipUnregisterFatBinary)
SAME_TYPE(hipLaunchKernel)
SAME_TYPE(hipLaunchKernel_spt)
SAME_TYPE(hipModuleLaunchKernel)
SAME_TYPE(hipModuleLoadData)
SAME_TYPE(hipModuleLoadDataEx)
SAME_TYPE(hipModuleGetFunction)
SAME_TYPE(hipModuleUnload)
// clang-format on
#undef SAME_TYPE
