// Device code the rdc sample's kernel calls from another translation unit (nvcc -rdc=true):
// a function it cannot inline and a variable it updates.
#include "common.h"

__device__ unsigned rdc_calls;

__device__ __noinline__ float weight(int i, int period) {
  atomicAdd(&rdc_calls, 1u);
  return (float)(i % period) / (float)period;
}
