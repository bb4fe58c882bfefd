/* The kernels a process really ran, as the CUDA driver reports them through CUPTI: evidence
 * from outside the shim that a launch ran a specialized variant (whose name carries the
 * "$proteus$" suffix) and not the original kernel.
 *
 * Loaded by the driver itself (CUDA_INJECTION64_PATH=libkernel_trace.so): at cuInit it calls
 * InitializeInjection, which enables CUPTI's kernel activity records. At exit every record is
 * flushed and the kernel names are written, one per line in execution order, to the file named
 * by CUPTI_KERNEL_TRACE_FILE; with CUPTI_KERNEL_TRACE_TIMES=1 each name is followed by a tab and
 * the kernel's time on the GPU in nanoseconds (its record's end minus start, both taken by the
 * GPU: a benchmark's kernel time that the host's noise does not reach). Built by
 * bench/lib/cupti.py against the nvidia-cuda-cupti
 * wheel's headers and library. Graph replays are included: the records are of kernels that
 * executed, however they were launched. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUFFER_BYTES (8u << 20)
#define ALIGNMENT 8

static FILE *out;
static int times;

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  uint8_t *b = aligned_alloc(ALIGNMENT, BUFFER_BYTES);
  *buffer = b;
  *size = b ? BUFFER_BYTES : 0;
  *max_records = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *record = NULL;
  while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    /* the record of the library built against (CUPTI 13.0 fills CUpti_ActivityKernel10) */
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
      if (times) fprintf(out, "%s\t%llu\n", k->name, (unsigned long long)(k->end - k->start));
      else fprintf(out, "%s\n", k->name);
    }
  }
  free(buffer);
}

static void at_exit(void) {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (out) fclose(out);
  out = NULL;
}

int InitializeInjection(void) {
  const char *path = getenv("CUPTI_KERNEL_TRACE_FILE");
  if (!path || !(out = fopen(path, "w"))) return 1;
  const char *t = getenv("CUPTI_KERNEL_TRACE_TIMES");
  times = t && t[0] == '1';
  if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    fprintf(out, "#error CUPTI refused\n");
    return 1;
  }
  atexit(at_exit);
  return 1;
}
