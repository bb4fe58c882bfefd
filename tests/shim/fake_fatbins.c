/* A library with what clang puts in a CUDA object's .nvFatBinSegment: one wrapper of a fat
 * binary, and two that the shim's scan must pass over (tests/shim/test_shim.c). */
#include "cuda_api.h"

const unsigned fake_fatbin[4] __attribute__((aligned(8))) = {FATBIN_MAGIC, 0x00100001u, 0, 0};
static const unsigned not_a_fatbin[4] __attribute__((aligned(8))) = {0x12345678u, 0, 0, 0};

__attribute__((section(".nvFatBinSegment"), used)) const fatbin_wrapper fake_wrappers[3] = {
    {FATBIN_WRAPPER_MAGIC, 1, fake_fatbin, 0},
    {0xdeadbeefu, 1, fake_fatbin, 0},           /* not a wrapper */
    {FATBIN_WRAPPER_MAGIC, 1, not_a_fatbin, 0}, /* a wrapper of no fat binary */
};
