// Kernels run as CUDA graph nodes, as apps that replay work make them:
//  - launches captured into a graph: the first launch of a kernel inside a global-mode capture,
//    and a kernel already launched (and specialized) outside the capture launched again inside
//    it; then the instantiated graph's node given a new scalar the way a node is updated in
//    place: its parameters read back (driver API, cuGraphKernelNodeGetParams), one argument
//    changed, set on the executable graph;
//  - a graph built by hand (cudaGraphAddKernelNode), its node given a new scalar through the
//    runtime (cudaGraphExecKernelNodeSetParams), then the whole executable graph updated from
//    another graph of the same shape (cudaGraphExecUpdate).
// A node that ran code with another value folded in than its arguments would show in a
// checksum: each result is one. With an argument MS, a graph whose one node is `fill` is then
// replayed for MS milliseconds (a replay a millisecond): its variant, queued at instantiation
// in a cold run, lands meanwhile and the later replays run it. fill writes the same values
// however often it runs, so the checksum does not depend on the count.
#include <cuda.h>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include "common.h"

__global__ void bump(float *y, float by, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += by;
}

__global__ void fill(float *z, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = v * (float)(i % 97);
}

__global__ void scale_add(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

typedef CUresult (*get_params_fn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
typedef CUresult (*set_params_fn)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *);
typedef CUresult (*func_name_fn)(const char **, CUfunction);

static void *driver_fn(const char *name, unsigned version) {   // the version that brought the signature used
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) { fprintf(stderr, "no driver entry point %s\n", name); exit(1); }
  return fn;
}

int main(int argc, char **argv) {
  const int n = 1 << 16, threads = 256, blocks = n / threads;
  float *x, *y;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMalloc(&y, n * sizeof(float)));
  static float hx[1 << 16], hy[1 << 16];
  for (int i = 0; i < n; ++i) hx[i] = (float)((i * 2654435761u) % 1000) / 1000.f;
  CHECK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0, n * sizeof(float)));

  // outside any capture: scale_add with a = 2 (a variant, under the tool)
  scale_add<<<blocks, threads>>>(y, x, 2.f, n);
  CHECK_LAUNCH();

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  bump<<<blocks, threads, 0, s>>>(y, 0.25f, n);          // bump's first launch, inside the capture
  scale_add<<<blocks, threads, 0, s>>>(y, x, 2.f, n);    // the same arguments as the launch outside
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 3; ++r) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  print_checksum("graph", hy, sizeof hy);

  // the scale_add node, updated in place: a = 5
  size_t count = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  cudaGraphNode_t nodes[8];
  if (count > 8) { fprintf(stderr, "unexpected graph: %zu nodes\n", count); return 1; }
  CHECK(cudaGraphGetNodes(graph, nodes, &count));
  get_params_fn get = (get_params_fn)driver_fn("cuGraphKernelNodeGetParams", 12000);
  set_params_fn set = (set_params_fn)driver_fn("cuGraphExecKernelNodeSetParams", 12000);
  func_name_fn name_of = (func_name_fn)driver_fn("cuFuncGetName", 12030);
  int updated = 0;
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(nodes[i], &type));
    CUDA_KERNEL_NODE_PARAMS p;
    const char *name = nullptr;
    if (type != cudaGraphNodeTypeKernel || get((CUgraphNode)nodes[i], &p) != CUDA_SUCCESS ||
        name_of(&name, p.func) != CUDA_SUCCESS || strncmp(name, "_Z9scale_add", 12) != 0)
      continue;
    float a = 5.f;
    void *args[4] = {p.kernelParams[0], p.kernelParams[1], &a, p.kernelParams[3]};
    p.kernelParams = args;
    if (set((CUgraphExec)exec, (CUgraphNode)nodes[i], &p) != CUDA_SUCCESS) { fprintf(stderr, "set params failed\n"); return 1; }
    updated = 1;
  }
  if (!updated) { fprintf(stderr, "scale_add's node not found\n"); return 1; }
  for (int r = 0; r < 2; ++r) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  print_checksum("graph_updated", hy, sizeof hy);

  // outside the capture again: both kernels as usual
  bump<<<blocks, threads>>>(y, 0.5f, n);
  scale_add<<<blocks, threads>>>(y, x, 2.f, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  print_checksum("after", hy, sizeof hy);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));

  // by hand: one bump node (the driver copies its arguments when the node is added)
  int count_n = n;
  float by = 1.5f;
  void *bump_args[3] = {&y, &by, &count_n};
  cudaKernelNodeParams kp = {};
  kp.func = (void *)bump;
  kp.gridDim = dim3(blocks);
  kp.blockDim = dim3(threads);
  kp.kernelParams = bump_args;
  cudaGraph_t hand, hand2;
  cudaGraphNode_t node, node2;
  CHECK(cudaGraphCreate(&hand, 0));
  CHECK(cudaGraphAddKernelNode(&node, hand, nullptr, 0, &kp));
  cudaGraphExec_t hexec;
  CHECK(cudaGraphInstantiate(&hexec, hand, 0));
  for (int r = 0; r < 2; ++r) CHECK(cudaGraphLaunch(hexec, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  print_checksum("hand", hy, sizeof hy);

  by = 0.75f;   // the node's scalar, set on the executable graph
  CHECK(cudaGraphExecKernelNodeSetParams(hexec, node, &kp));
  for (int r = 0; r < 2; ++r) CHECK(cudaGraphLaunch(hexec, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  print_checksum("hand_set", hy, sizeof hy);

  by = -2.f;   // another graph of the same shape, applied as a whole
  CHECK(cudaGraphCreate(&hand2, 0));
  CHECK(cudaGraphAddKernelNode(&node2, hand2, nullptr, 0, &kp));
  cudaGraphExecUpdateResultInfo info;
  CHECK(cudaGraphExecUpdate(hexec, hand2, &info));
  for (int r = 0; r < 2; ++r) CHECK(cudaGraphLaunch(hexec, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  print_checksum("hand_update", hy, sizeof hy);
  CHECK(cudaGraphExecDestroy(hexec));
  CHECK(cudaGraphDestroy(hand2));
  CHECK(cudaGraphDestroy(hand));

  if (argc > 1) {
    const double ms = atof(argv[1]);
    float v = 0.5f;
    void *fill_args[3] = {&y, &v, &count_n};
    cudaKernelNodeParams fp = {};
    fp.func = (void *)fill;
    fp.gridDim = dim3(blocks);
    fp.blockDim = dim3(threads);
    fp.kernelParams = fill_args;
    cudaGraph_t fg;
    cudaGraphNode_t fnode;
    cudaGraphExec_t fexec;
    CHECK(cudaGraphCreate(&fg, 0));
    CHECK(cudaGraphAddKernelNode(&fnode, fg, nullptr, 0, &fp));
    CHECK(cudaGraphInstantiate(&fexec, fg, 0));
    CHECK(cudaGraphDestroy(fg));   // while its node may still wait for a variant
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < ms) {
      CHECK(cudaGraphLaunch(fexec, s));
      CHECK(cudaStreamSynchronize(s));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
    print_checksum("fill", hy, sizeof hy);
    CHECK(cudaGraphExecDestroy(fexec));
  }
  return 0;
}
