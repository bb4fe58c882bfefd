/* The hit path: what every launch runs before it knows whether its variant exists. Inlined
 * into each platform's launch wrapper: the key, and the variant table's probe (the hashing and
 * the tables' layout are tables.h's). It takes no lock, makes no allocation, and calls neither
 * Python nor the driver: it runs on every launch an app makes, and a lock or a call there would
 * be paid on each. */
#ifndef PROTEUS_HITPATH_H
#define PROTEUS_HITPATH_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "shim.h"
#include "tables.h"

/* After a launch: bring back what the kernel's next hit reads, while the app works on. While
 * its variant compiles, the next launch runs the original through await_variant, which reads
 * the line of `unserved` too (a cold run's first thousands of launches). */
static inline void prefetch_hit(const void *h, kinfo *ki) {
  __builtin_prefetch(&handles[(uint32_t)mix64((uint64_t)(uintptr_t)h) & (HSLOTS - 1)]);
  if (!ki) return;
  __builtin_prefetch(ki);
  __builtin_prefetch(ki->fold);
  __builtin_prefetch(ki->sizes);
  sentry *e = atomic_load_explicit(&ki->last, memory_order_relaxed);
  if (e) {
    __builtin_prefetch(e);
    __builtin_prefetch((const char *)e + 64);
    if (!atomic_load_explicit(&e->fn, memory_order_relaxed)) __builtin_prefetch(&ki->unserved);   /* e: read by this launch */
  }
}

/* The bytes that select a variant: the policy generation, folded arguments, then block and
 * grid when they matter. Returns the key length, or -1 when it does not fit (the kernel then
 * runs unspecialized). */
static inline int build_key(kinfo *ki, void **params, dim3 grid, dim3 block, uint8_t *key, uint32_t gen) {
  uint32_t len = 4;
  memcpy(key, &gen, 4);
  for (uint32_t i = 0; i < ki->nparams; i++) {
    if (!atomic_load_explicit(&ki->fold[i], memory_order_relaxed)) continue;
    uint32_t size = ki->sizes[i];
    if (len + size > MAX_KEY - 24) return -1;
    /* fixed sizes copy inline, not through a libc call per argument */
    if (size == 4) memcpy(key + len, params[i], 4);
    else if (size == 8) memcpy(key + len, params[i], 8);
    else memcpy(key + len, params[i], size);
    len += size;
  }
  uint32_t dims = atomic_load_explicit(&ki->dims_in_key, memory_order_relaxed);
  if (dims & PROTO_DIMS_BLOCK) {
    memcpy(key + len, &block, 12);
    len += 12;
  }
  if (dims & PROTO_DIMS_GRID) {
    memcpy(key + len, &grid, 12);
    len += 12;
  }
  return (int)len;
}

/* build_key under the sequence lock, for the hit path: -2 when the policy changed meanwhile. */
static inline int stable_key(kinfo *ki, void **params, dim3 grid, dim3 block, uint8_t *key) {
  uint32_t g = atomic_load_explicit(&ki->gen, memory_order_acquire);
  if (g & 1) return -2;
  int len = build_key(ki, params, grid, block, key, g);
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&ki->gen, memory_order_relaxed) == g ? len : -2;
}

/* A launch asks for the variant its kernel's latest hit found first: a loop that launches one
 * variant over and over (every argument it changes unfolded) skips the hash and the table's line. */
static inline sentry *find_variant(kinfo *ki, gpu_ctx ctx, const uint8_t *key, uint32_t len) {
  sentry *e = atomic_load_explicit(&ki->last, memory_order_acquire);
  if (e && e->ctx == ctx && e->keylen == len && key_equal(e->key, key, len)) return e;
  if ((e = variant_lookup(key_hash(ki, ctx, key, len), ki, ctx, key, len)))
    atomic_store_explicit(&ki->last, e, memory_order_release);
  return e;
}

#endif
