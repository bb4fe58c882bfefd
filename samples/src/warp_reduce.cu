// Warp shuffles and cooperative groups: what clang's -fembed-bitcode cannot build (its
// second device step targets sm_30, whose PTX has no shfl.sync), and what the recommended
// recipe builds for the real GPU. Scalars that set trip counts, as the JIT likes them.
#include "common.h"
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <vector>

namespace cg = cooperative_groups;

// Each thread smooths its value `rounds` times, then the warp sums with __shfl_xor_sync and
// lane 0 writes the warp's total.
__global__ void warp_sums(const float *in, float *out, int n, int rounds, float keep) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? in[i] : 0.0f;
  for (int r = 0; r < rounds; ++r) v = keep * v + (1.0f - keep) * __sinf(v);
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if ((threadIdx.x & 31) == 0) out[i / 32] = v;
}

// The same sum through cooperative groups: a tile of `Tile` threads reduces with cg::reduce,
// and a vote (any) counts tiles whose total is negative.
template <int Tile>
__global__ void tile_sums(const float *in, float *out, unsigned *negative, int n, int stride) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<Tile> tile = cg::tiled_partition<Tile>(block);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = 0.0f;
  for (int k = 0; k < stride; ++k) {
    int j = i * stride + k;
    v += j < n ? in[j] : 0.0f;
  }
  float total = cg::reduce(tile, v, cg::plus<float>());
  bool neg = tile.any(total < 0.0f);
  if (tile.thread_rank() == 0) {
    out[i / Tile] = total;
    if (neg) atomicAdd(negative, 1u);
  }
}

int main() {
  const int n = 1 << 20, threads = 256;
  std::vector<float> h(n);
  fill_uniform(h.data(), n, 7);
  float *in = to_device(h.data(), n), *warps, *tiles;
  unsigned *negative;
  CHECK(cudaMalloc(&warps, n / 32 * sizeof(float)));
  CHECK(cudaMalloc(&tiles, n / 16 * sizeof(float)));
  CHECK(cudaMalloc(&negative, sizeof(unsigned)));
  CHECK(cudaMemset(negative, 0, sizeof(unsigned)));
  warp_sums<<<n / threads, threads>>>(in, warps, n, 6, 0.75f);
  CHECK_LAUNCH();
  tile_sums<16><<<n / 4 / threads, threads>>>(in, tiles, negative, n, 4);
  CHECK_LAUNCH();
  std::vector<float> hw(n / 32), ht(n / 64);
  unsigned hn = 0;
  to_host(hw.data(), warps, n / 32);
  to_host(ht.data(), tiles, n / 64);
  to_host(&hn, negative, 1);
  printf("negative tiles %u\n", hn);
  print_checksum("warp_sums", hw.data(), hw.size() * sizeof(float));
  print_checksum("tile_sums", ht.data(), ht.size() * sizeof(float));
  CHECK(cudaFree(in)); CHECK(cudaFree(warps)); CHECK(cudaFree(tiles)); CHECK(cudaFree(negative));
  return 0;
}
