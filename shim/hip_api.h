/* The HIP runtime as libproteus.so sees it: a few types and the functions the shim interposes
 * or calls, declared here so that the shim builds without HIP headers (like the CUDA half).
 *
 * PROTEUS_HIP_API(X) lists every such function once; hip.c turns the list into
 * pointer types for the real functions and checks its own definitions against it.
 * tests/shim/test_hip_shim.py proves the list right: it redeclares each function with ROCm's own
 * types after <hip/hip_runtime_api.h> (define PROTEUS_HIP_REAL_TYPES first), where any
 * difference is a compile error, and compares the registration functions, which no header
 * declares, with the calls clang emits for a HIP translation unit. */
#ifndef PROTEUS_HIP_H
#define PROTEUS_HIP_H

#include <stddef.h>

#ifndef PROTEUS_HIP_REAL_TYPES
typedef int hipError_t;                    /* an enum in ROCm: int-sized, hipSuccess = 0 */
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef void *hipDeviceptr_t;
typedef int hipJitOption;                  /* an enum in ROCm */
typedef int hipStreamCaptureStatus;        /* an enum in ROCm: hipStreamCaptureStatusNone = 0 */
typedef struct hipDeviceProp_t hipDeviceProp_t;   /* never dereferenced: see hip_arch() */
/* dim3 (three unsigned ints) comes from shim.h */
#endif

#define HIP_SUCCESS 0
#define HIP_ERROR_INVALID_IMAGE 200        /* hipErrorInvalidImage */
#define HIP_ERROR_NOT_READY 600            /* hipErrorNotReady */
#define HIP_ERROR_STREAM_CAPTURE_IMPLICIT 906   /* hipErrorStreamCaptureImplicit: the null stream while another captures */
#define HIP_STREAM_PER_THREAD ((hipStream_t)2)   /* hipStreamPerThread */
#define HIP_FATBIN_MAGIC 0x48495046u       /* clang's __hip_fatbin_wrapper: "HIPF" */
/* offsetof(hipDeviceProp_t, gcnArchName) in ROCm 5's layout, which ROCm 6 keeps as
 * hipDeviceProp_tR0000 (checked against the installed headers by tests/shim/test_hip_shim.py) */
#define HIP_GCN_ARCH_NAME_OFFSET 396

/* clang's __hip_fatbin_wrapper, what __hipRegisterFatBinary is handed */
typedef struct {
  unsigned magic, version;
  const void *binary;
  void *unused;
} hip_fatbin_wrapper;

#define PROTEUS_HIP_API(X) \
  /* interposed: the registration calls clang emits into every HIP translation unit ... */ \
  X(void **, __hipRegisterFatBinary, (const void *data)) \
  X(void, __hipRegisterFunction, \
    (void **modules, const void *hostFunction, char *deviceFunction, const char *deviceName, unsigned int threadLimit, \
     void *tid, void *bid, void *blockDim, void *gridDim, int *wSize)) \
  X(void, __hipRegisterVar, \
    (void **modules, void *var, char *hostVar, char *deviceVar, int ext, size_t size, int constant, int global)) \
  X(void, __hipUnregisterFatBinary, (void **modules)) \
  /* ... the launches (<<<>>> calls hipLaunchKernel, or _spt with a per-thread default stream) ... */ \
  X(hipError_t, hipLaunchKernel, \
    (const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args, size_t sharedMemBytes, hipStream_t stream)) \
  X(hipError_t, hipLaunchKernel_spt, \
    (const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args, size_t sharedMemBytes, hipStream_t stream)) \
  X(hipError_t, hipModuleLaunchKernel, \
    (hipFunction_t f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
     unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, hipStream_t stream, void **kernelParams, \
     void **extra)) \
  /* ... and the module API, to learn which image and kernel a hipFunction_t is */ \
  X(hipError_t, hipModuleLoadData, (hipModule_t * module, const void *image)) \
  X(hipError_t, hipModuleLoadDataEx, \
    (hipModule_t * module, const void *image, unsigned int numOptions, hipJitOption *options, void **optionValues)) \
  X(hipError_t, hipModuleGetFunction, (hipFunction_t * function, hipModule_t module, const char *kname)) \
  X(hipError_t, hipModuleUnload, (hipModule_t module)) \
  /* called by the shim itself, never interposed */ \
  X(hipError_t, hipGetDevice, (int *deviceId)) \
  X(hipError_t, hipSetDevice, (int deviceId)) \
  X(hipError_t, hipStreamQuery, (hipStream_t stream)) \
  X(hipError_t, hipStreamIsCapturing, (hipStream_t stream, hipStreamCaptureStatus * pCaptureStatus)) \
  X(hipError_t, hipGetDeviceProperties, (hipDeviceProp_t * prop, int deviceId)) \
  X(hipError_t, hipGetSymbolAddress, (void **devPtr, const void *symbol)) \
  X(hipError_t, hipModuleGetGlobal, (hipDeviceptr_t * dptr, size_t *bytes, hipModule_t hmod, const char *name)) \
  X(hipError_t, hipGetLastError, (void)) \
  X(hipError_t, hipPeekAtLastError, (void))

/* The pointers to the real functions (hip.c), HIP's table for the core, and what the tests call
 * of hip.c. */
#ifndef PROTEUS_HIP_REAL_TYPES
#include "platform.h"
#include "shim.h"
#define PROTEUS_HIP_DECLARE(ret, name, params) \
  typedef ret(*name##_fn) params; \
  HIDDEN extern name##_fn real_##name;
PROTEUS_HIP_API(PROTEUS_HIP_DECLARE)
#undef PROTEUS_HIP_DECLARE
HIDDEN extern const struct gpu_ops hip_ops;
HIDDEN void arch_from_props(const unsigned char *props, size_t size, char *out, size_t nout);
HIDDEN hipFunction_t hip_pick(const void *handle, void **params, dim3 grid, dim3 block, hipStream_t stream);
#endif

#endif
