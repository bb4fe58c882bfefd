/* The CUDA driver and runtime as libproteus.so sees them: the few types it uses, the functions
 * it wraps or calls, listed once (PROTEUS_CUDA_API: cuda.c defines a pointer to each real one,
 * the CUDA files read them through the declarations made here), and what the CUDA files share.
 * Included by the CUDA files only: the core reaches CUDA through cuda_ops (platform.h). */
#ifndef PROTEUS_CUDA_API_H
#define PROTEUS_CUDA_API_H

#include "platform.h"
#include "shim.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUlibrary, *CUkernel;   /* gpu_ctx, gpu_fn, gpu_stream */
typedef unsigned long long CUdeviceptr;
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
#define CUDA_ERROR_NOT_READY 600
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

HIDDEN extern const struct gpu_ops cuda_ops;   /* cuda.c */

/* The runtime's own function, found on first use (these are only called when it is loaded). */
#define RUNTIME_REAL(n) \
  (*({ \
    if (!real_##n) *(void **)&real_##n = dlsym(RTLD_NEXT, #n); \
    &real_##n; \
  }))


typedef struct {   /* CUDA_KERNEL_NODE_PARAMS_v2 (_v3: the same fields) */
  CUfunction func;
  unsigned gx, gy, gz, bx, by, bz, shmem;
  void **params, **extra;
  CUkernel kern;
  CUcontext ctx;
} knode;

/* __fatBinC_Wrapper_t, clang's and nvcc's, in a host object's .nvFatBinSegment section: what
 * __cudaRegisterFatBinary is handed. Its data is the fat binary, in .nv_fatbin. */
#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xba55ed50u
typedef struct {
  unsigned magic, version;
  const void *data;
  void *filename_or_fatbins;
} fatbin_wrapper;

#define PROTEUS_CUDA_API(X) \
  X(CUresult, cuGetProcAddress, (const char *, void **, int, unsigned long long, int *)) \
  X(CUresult, cuGetProcAddress_v2, (const char *, void **, int, unsigned long long, int *)) \
  X(CUresult, cuLaunchKernel, \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
  X(CUresult, cuLaunchKernel_ptsz, \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
  X(CUresult, cuLaunchKernelEx, (const CUlaunchConfig *, CUfunction, void **, void **)) \
  X(CUresult, cuLaunchKernelEx_ptsz, (const CUlaunchConfig *, CUfunction, void **, void **)) \
  X(CUresult, cuLaunchCooperativeKernel, \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
  X(CUresult, cuLaunchCooperativeKernel_ptsz, \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
  X(CUresult, cuModuleLoadData, (CUmodule *, const void *)) \
  X(CUresult, cuModuleLoadDataEx, (CUmodule *, const void *, unsigned, void *, void **)) \
  X(CUresult, cuModuleLoadFatBinary, (CUmodule *, const void *)) \
  X(CUresult, cuModuleGetFunction, (CUfunction *, CUmodule, const char *)) \
  X(CUresult, cuModuleGetGlobal, (CUdeviceptr *, size_t *, CUmodule, const char *)) \
  X(CUresult, cuLibraryLoadData, (CUlibrary *, const void *, void *, void **, unsigned, void *, void **, unsigned)) \
  X(CUresult, cuLibraryGetKernel, (CUkernel *, CUlibrary, const char *)) \
  X(CUresult, cuLibraryGetGlobal, (CUdeviceptr *, size_t *, CUlibrary, const char *)) \
  X(CUresult, cuKernelGetFunction, (CUfunction *, CUkernel)) \
  X(CUresult, cuModuleUnload, (CUmodule)) \
  X(CUresult, cuLibraryUnload, (CUlibrary)) \
  X(CUresult, cuCtxGetCurrent, (CUcontext *)) \
  X(CUresult, cuCtxGetDevice, (CUdevice *)) \
  X(CUresult, cuDeviceGetCount, (int *)) \
  X(CUresult, cuDeviceGet, (CUdevice *, int)) \
  X(CUresult, cuDeviceGetAttribute, (int *, int, CUdevice)) \
  X(CUresult, cuDriverGetVersion, (int *)) \
  X(CUresult, cuInit, (unsigned)) \
  X(CUresult, cuGetErrorName, (CUresult, const char **)) \
  X(CUresult, cuCtxSetCurrent, (CUcontext)) \
  X(CUresult, cuEventCreate, (void **, unsigned)) \
  X(CUresult, cuEventRecord, (void *, CUstream)) \
  X(CUresult, cuEventQuery, (void *)) \
  X(CUresult, cuEventSynchronize, (void *)) \
  X(CUresult, cuEventDestroy, (void *)) \
  X(CUresult, cuEventElapsedTime, (float *, void *, void *)) \
  X(CUresult, cuStreamIsCapturing, (CUstream, int *)) \
  X(CUresult, cuThreadExchangeStreamCaptureMode, (int *)) \
  X(CUresult, cuStreamBeginCapture_v2, (CUstream, int)) \
  X(CUresult, cuStreamBeginCapture_ptsz, (CUstream, int)) \
  X(CUresult, cuStreamBeginCaptureToGraph, (CUstream, void *, const void *, const void *, size_t, int)) \
  X(CUresult, cuStreamBeginCaptureToGraph_ptsz, (CUstream, void *, const void *, const void *, size_t, int)) \
  X(CUresult, cuStreamEndCapture, (CUstream, void **)) \
  X(CUresult, cuStreamEndCapture_ptsz, (CUstream, void **)) \
  X(CUresult, cuStreamQuery, (CUstream)) \
  X(CUresult, cuFuncSetAttribute, (CUfunction, int, int)) \
  X(CUresult, cuFuncSetCacheConfig, (CUfunction, int)) \
  X(CUresult, cuKernelSetAttribute, (int, int, CUkernel, CUdevice)) \
  X(CUresult, cuKernelSetCacheConfig, (CUkernel, int, CUdevice)) \
  X(CUresult, cuGraphInstantiateWithFlags, (void **, void *, unsigned long long)) \
  X(CUresult, cuGraphInstantiate_v2, (void **, void *, void **, char *, size_t)) \
  X(CUresult, cuGraphInstantiateWithParams, (void **, void *, void *)) \
  X(CUresult, cuGraphInstantiateWithParams_ptsz, (void **, void *, void *)) \
  X(CUresult, cuGraphExecKernelNodeSetParams_v2, (void *, void *, const knode *)) \
  X(CUresult, cuGraphExecKernelNodeSetParams, (void *, void *, const void *)) \
  X(CUresult, cuGraphExecNodeSetParams, (void *, void *, void *)) \
  X(CUresult, cuGraphExecUpdate_v2, (void *, void *, void *)) \
  X(CUresult, cuGraphExecUpdate, (void *, void *, void **, int *)) \
  X(CUresult, cuGraphLaunch, (void *, CUstream)) \
  X(CUresult, cuGraphLaunch_ptsz, (void *, CUstream)) \
  X(CUresult, cuGraphExecDestroy, (void *)) \
  X(CUresult, cuGraphDestroy, (void *)) \
  X(CUresult, cuGraphDestroyNode, (void *)) \
  X(CUresult, cuGraphGetNodes, (void *, void **, size_t *)) \
  X(CUresult, cuGraphNodeGetType, (void *, int *)) \
  X(CUresult, cuGraphKernelNodeGetParams_v2, (void *, knode *)) \
  X(CUresult, cuGraphKernelNodeSetParams_v2, (void *, const knode *)) \
  X(CUresult, cuGraphKernelNodeGetAttribute, (void *, int, void *)) \
  X(CUresult, cuGraphClone, (void **, void *)) \
  X(void **, __cudaRegisterFatBinary, (void *)) \
  X(void, __cudaRegisterFatBinaryEnd, (void **)) \
  X(void, __cudaRegisterFunction, (void **, const char *, char *, const char *, int, void *, void *, void *, void *, int *)) \
  X(void, __cudaRegisterVar, (void **, char *, char *, const char *, int, size_t, int, int)) \
  X(cudaError_t, cudaLaunchKernel, (const void *, dim3, dim3, void **, size_t, void *)) \
  X(cudaError_t, cudaLaunchKernel_ptsz, (const void *, dim3, dim3, void **, size_t, void *)) \
  X(cudaError_t, cudaLaunchKernelExC, (const cudaLaunchConfig_t *, const void *, void **)) \
  X(cudaError_t, cudaGetSymbolAddress, (void **, const void *)) \
  X(cudaError_t, cudaGetFuncBySymbol, (void **, const void *))

/* In a function given an entry point `real` for the name `sym` (cuGetProcAddress): where the
 * name is `name`, keep the real one in real_<w> and hand out the wrapper w_<w> instead. */
#define WRAP_PROC(name, w) \
  if (!strcmp(sym, name)) { \
    *(void **)&real_##w = real; \
    return (void *)w_##w; \
  }

#define PROTEUS_CUDA_DECLARE(ret, name, params) HIDDEN extern ret(*real_##name) params;
PROTEUS_CUDA_API(PROTEUS_CUDA_DECLARE)
#undef PROTEUS_CUDA_DECLARE

HIDDEN void *cuda_sym(const char *name);
/* Why the app had no usable GPU, for its report ("" where it had one, or where that cannot be
 * told): its own cuInit failed, or the driver cannot be loaded, or, where nothing was launched,
 * cuInit fails when asked now. may_init: the driver may still be asked, which only holds before
 * the exit handlers run. */
HIDDEN const char *cuda_no_gpu_reason(int may_init);
HIDDEN void init_driver_calls(void);
HIDDEN int current_arch(void);                       /* SM version of the current context's device, 0: none */
HIDDEN uint64_t cuda_global_address(kinfo *ki, void *owner, const char *name);   /* cuda_ops.global_address */
/* stream capture (cuda_capture.c): cuda_ops.stream_capturing; stream_capturing, whether it is
 * (or the legacy stream while another captures); the shim's own threads in relaxed mode */
HIDDEN int cuda_capture_state(CUstream s);
HIDDEN int stream_capturing(CUstream s);
HIDDEN void relax_capture_mode(void);
/* the last run's variants, answered ahead, loaded at their first launch (cuda_warm.c) */
HIDDEN extern const struct gpu_preload cuda_preload;
HIDDEN void warm_image(const void *image);                  /* a fat binary registered or loaded */
HIDDEN int warm_scan(void);                                  /* the loaded objects' .nvFatBinSegment: fat binaries new */
HIDDEN int fatbins_seen(void);                               /* fat binaries known, after a scan */
HIDDEN int warm_enabled(void);                               /* PROTEUS_PRELOAD */
HIDDEN void warm_first(void);                                /* the prestart thread, Python up: answers (jit_lock) */
HIDDEN void warm_start(void);                                /* then answers for images loaded later, until warm_finish */
HIDDEN void warm_resolve(kinfo *ki, CUcontext ctx);          /* a first launch: the answers made ahead for it (jit_lock) */
HIDDEN void warm_finish(void);                               /* before exit handlers */
HIDDEN void warm_atfork_child(void);
/* cuda_attrs.c: the app's function attributes, carried to the variants */
HIDDEN void apply_attrs(kinfo *ki, CUfunction variant);
HIDDEN CUresult w_cuFuncSetAttribute(CUfunction f, int attrib, int value);
HIDDEN CUresult w_cuFuncSetCacheConfig(CUfunction f, int config);
HIDDEN CUresult w_cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev);
HIDDEN CUresult w_cuKernelSetCacheConfig(CUkernel k, int config, CUdevice dev);
/* PROTEUS_VALIDATE (cuda_validate.c): a variant's first launch checked in the original's shadow.
 * validate_begin answers the function to launch (NULL: the original); validate_end, after the
 * app's launch, compares. validate_refuse: a launch validation cannot repeat (the original runs). */
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **,
                              void **);
HIDDEN CUfunction validate_begin(kinfo *ki, CUfunction variant, CUfunction original, void **params, dim3 grid, dim3 block,
                                 unsigned shmem, CUstream stream, launch_fn launch);
HIDDEN void validate_end(void);
HIDDEN CUfunction validate_refuse(kinfo *ki, const char *why);
/* the launch wrappers (cuda_launch.c), handed out by cuda.c's cuGetProcAddress */
HIDDEN CUresult w_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                 unsigned shmem, CUstream s, void **params, void **extra);
HIDDEN CUresult w_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                      unsigned shmem, CUstream s, void **params, void **extra);
HIDDEN CUresult w_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e);
HIDDEN CUresult w_cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e);
HIDDEN CUresult w_cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                            unsigned bz, unsigned shmem, CUstream s, void **params);
HIDDEN CUresult w_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                                 unsigned bz, unsigned shmem, CUstream s, void **params);
HIDDEN CUresult w_cuStreamBeginCapture_v2(CUstream s, int mode);
HIDDEN CUresult w_cuStreamBeginCapture_ptsz(CUstream s, int mode);
HIDDEN CUresult w_cuStreamBeginCaptureToGraph(CUstream s, void *g, const void *deps, const void *edges, size_t n, int mode);
HIDDEN CUresult w_cuStreamBeginCaptureToGraph_ptsz(CUstream s, void *g, const void *deps, const void *edges, size_t n, int mode);
HIDDEN CUresult w_cuStreamEndCapture(CUstream s, void **g);
HIDDEN CUresult w_cuStreamEndCapture_ptsz(CUstream s, void **g);
/* graphs (cuda_graph.c): instantiated graphs' kernel nodes pointed at variants */
HIDDEN CUresult w_cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
HIDDEN CUresult w_cuGraphInstantiate_v2(void **exec, void *graph, void **err_node, char *log, size_t size);
HIDDEN CUresult w_cuGraphInstantiateWithParams(void **exec, void *graph, void *p);
HIDDEN CUresult w_cuGraphInstantiateWithParams_ptsz(void **exec, void *graph, void *p);
HIDDEN CUresult w_cuGraphExecKernelNodeSetParams_v2(void *exec, void *node, const knode *p);
HIDDEN CUresult w_cuGraphExecKernelNodeSetParams(void *exec, void *node, const void *p);
HIDDEN CUresult w_cuGraphExecNodeSetParams(void *exec, void *node, void *p);
HIDDEN CUresult w_cuGraphExecUpdate_v2(void *exec, void *graph, void *result);
HIDDEN CUresult w_cuGraphExecUpdate(void *exec, void *graph, void **err_node, int *result);
HIDDEN CUresult w_cuGraphLaunch(void *exec, CUstream s);
HIDDEN CUresult w_cuGraphLaunch_ptsz(void *exec, CUstream s);
HIDDEN CUresult w_cuGraphExecDestroy(void *exec);
HIDDEN CUresult w_cuGraphDestroy(void *graph);
HIDDEN CUresult w_cuGraphDestroyNode(void *node);
/* a CUkernel of a recorded kernel, whose functions nodes may hold */
HIDDEN void graph_library_kernel(CUkernel k);
/* a cuGraph* entry point, wrapped or not */
HIDDEN void *graph_proc(const char *sym, void *real, int ver, int ptsz);

/* ---- GPU time samples: a pair of events around a few launches: the 2nd, then every 64th
 * until SAMPLES_DENSE samples, then every 4,096th. A speed trial's turns (trial.c) are timed
 * around the same launch calls, with events of their own. The budget multiplies their mean by the
 * launches, so a few samples give it; each costs two event records and a query or two, which
 * every 64th launch of a long run would keep paying for no better estimate. */
#define SAMPLES_DENSE 16
static inline int sample_begin(kinfo *ki, CUstream s, trial_ticket *tk) {
  if (__builtin_expect(tk->t != NULL, 0)) turn_begin(tk, s);   /* a speed trial's turn: events of its own (trial.c) */
  /* while a capture is open anywhere, no event calls: a global-mode capture forbids them to
   * every thread in the process, and one made would end it invalid (cuda_capture.c) */
  if (!ki || atomic_load_explicit(&captures_open, memory_order_relaxed)) return 0;
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

static inline void sample_end(kinfo *ki, CUstream s, int started, trial_ticket *tk) {
  if (__builtin_expect(tk->t != NULL, 0)) turn_end(tk, s);
  if (!started) return;
  atomic_store(&ki->sample_state, real_cuEventRecord(ki->ev[1], s) == CUDA_SUCCESS ? SAMPLE_PENDING : SAMPLE_IDLE);
}

/* Collect a finished sample; called on later launches, never waits for the GPU. */
static inline void sample_poll(kinfo *ki) {
  if (!ki || atomic_load_explicit(&ki->sample_state, memory_order_acquire) != SAMPLE_PENDING ||
      atomic_load_explicit(&captures_open, memory_order_relaxed))
    return;
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

#endif
