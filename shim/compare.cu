// Which of two results differ from the original's, word by word (the validation's compare).
extern "C" __global__ void proteus_differs(const unsigned long long *a, const unsigned long long *b,
                                           const unsigned long long *c, unsigned long long words,
                                           const unsigned char *ta, const unsigned char *tb, const unsigned char *tc,
                                           unsigned tail, unsigned *out) {
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned da = 0, dc = 0;
  for (; i < words; i += stride) {
    unsigned long long x = b[i];
    da |= a[i] != x;
    if (c) dc |= c[i] != x;
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    da |= ta[threadIdx.x] != tb[threadIdx.x];
    if (tc) dc |= tc[threadIdx.x] != tb[threadIdx.x];
  }
  if (__any_sync(0xffffffffu, da) && (threadIdx.x & 31) == 0) out[0] = 1;
  if (__any_sync(0xffffffffu, dc) && (threadIdx.x & 31) == 0) out[1] = 1;
}
