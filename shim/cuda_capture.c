/* Stream capture. A launch into a stream capture becomes a kernel node of the app's graph, which the app may
 * give other arguments later (cuGraphExecKernelNodeSetParams, a node's parameters read, changed
 * and set back) while a variant has the capture-time values folded in: so a captured launch
 * runs the original, always. Nor may a miss run in the capturing thread: loading a module
 * there is a call a global-mode capture forbids, and the capture would end invalid, the app's
 * graph NULL (docs/dev/findings/stream-capture.md). The hit
 * path asks the driver only while some capture is open (captures_open, counted by the Begin/
 * EndCapture wrappers below, in the core's count); a miss always asks. */
#include "cuda_api.h"
#include "shim.h"

/* cuda_ops.stream_capturing: 1 capturing, 0 not, -1 cannot be told. */
int cuda_capture_state(CUstream s) {
  int status = 0;
  if (!real_cuStreamIsCapturing) return -1;
  CUresult r = real_cuStreamIsCapturing(s, &status);
  /* 906 CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream, while another one captures */
  if (r == 906) return 1;
  return r == CUDA_SUCCESS ? status != 0 : -1;
}

int stream_capturing(CUstream s) { return cuda_capture_state(s) > 0; }

/* Our own threads (compile workers, the prestart thread) load modules whatever the app's
 * threads capture: relaxed mode, as CUDA asks of libraries, so a global-mode capture elsewhere
 * neither forbids those loads nor is ended by them. */
void relax_capture_mode(void) {
  int mode = 2;   /* CU_STREAM_CAPTURE_MODE_RELAXED */
  if (real_cuThreadExchangeStreamCaptureMode) real_cuThreadExchangeStreamCaptureMode(&mode);
}

static CUresult begun(CUresult r) {
  if (r == CUDA_SUCCESS) atomic_fetch_add(&captures_open, 1);
  return r;
}
CUresult w_cuStreamBeginCapture_v2(CUstream s, int mode) { return begun(real_cuStreamBeginCapture_v2(s, mode)); }
CUresult w_cuStreamBeginCapture_ptsz(CUstream s, int mode) { return begun(real_cuStreamBeginCapture_ptsz(s, mode)); }
CUresult w_cuStreamBeginCaptureToGraph(CUstream s, void *g, const void *deps, const void *edges, size_t n, int mode) {
  return begun(real_cuStreamBeginCaptureToGraph(s, g, deps, edges, n, mode));
}
CUresult w_cuStreamBeginCaptureToGraph_ptsz(CUstream s, void *g, const void *deps, const void *edges, size_t n, int mode) {
  return begun(real_cuStreamBeginCaptureToGraph_ptsz(s, g, deps, edges, n, mode));
}
/* A capture that was open (or invalidated) ends here, whatever EndCapture answers. */
static CUresult end_with(CUresult (*real)(CUstream, void **), CUstream s, CUstream asked, void **graph) {
  int status = 0;
  int open = real_cuStreamIsCapturing && real_cuStreamIsCapturing(asked, &status) == CUDA_SUCCESS && status != 0;
  CUresult r = real(s, graph);
  if (open && atomic_load(&captures_open) > 0) atomic_fetch_sub(&captures_open, 1);
  return r;
}
CUresult w_cuStreamEndCapture(CUstream s, void **g) { return end_with(real_cuStreamEndCapture, s, s, g); }
CUresult w_cuStreamEndCapture_ptsz(CUstream s, void **g) {
  return end_with(real_cuStreamEndCapture_ptsz, s, s ? s : (CUstream)0x2 /* CU_STREAM_PER_THREAD */, g);
}
