/* The hit path: what every launch runs before it knows whether its variant exists. Inlined
 * into each launch wrapper: hashing, the handle table's probe, the key, and the variant table's
 * probe; no lock, no allocation, no call into Python or the driver. */
#ifndef PROTEUS_HITPATH_H
#define PROTEUS_HITPATH_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "shim.h"

#define HSLOTS (1u << 16)
#define SSLOTS (1u << 16)
/* Launch handles, open addressing: the handle and its kernel in the slot itself, so a hit finds
 * the kernel in the one line it probes. A slot is claimed once (handle written last, with
 * release) and never emptied; a handle registered again gets its new kernel in place. */
typedef struct { _Atomic(const void *) handle; _Atomic(kinfo *) ki; } hslot;
HIDDEN extern hslot handles[HSLOTS];
HIDDEN extern _Atomic(void *) handle_owners[HSLOTS];
HIDDEN extern _Atomic(sentry *) variants[SSLOTS];

static inline uint64_t mix64(uint64_t h) {
  h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ull; h ^= h >> 33;
  return h;
}

/* Every hit hashes its launch's key. A full mix64 per 8-byte word cost about 1 ns a byte (a
 * 220-byte key: 261 ns a hit, 97 ns with this hash and build_key's inline copies, on the build
 * machine: bench/results/hitpath-2026-11-23-vm-*.json); here each word costs one multiply and
 * one shift, on two independent lanes, and one mix64 at the end spreads the result. Each step
 * is a bijection of the lane, so keys of one length that differ anywhere reach the final mix
 * in different states. In-process only: nothing stores these hashes. */
static inline uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t h) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint64_t a = h, b = ~h, len = n;
  for (; n >= 16; p += 16, n -= 16) {
    uint64_t v, w;
    memcpy(&v, p, 8);
    memcpy(&w, p + 8, 8);
    a = (a ^ v) * k; a ^= a >> 29;
    b = (b ^ w) * k; b ^= b >> 29;
  }
  if (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    a = (a ^ v) * k; a ^= a >> 29;
    p += 8; n -= 8;
  }
  uint64_t tail = 0;
  memcpy(&tail, p, n);
  return mix64(a ^ (b * 0xc2b2ae3d27d4eb4full) ^ tail ^ (len << 56));
}

/* The slot holding h, or NULL. Lock-free. */
static inline hslot *find_handle(const void *h) {
  uint32_t i = (uint32_t)mix64((uint64_t)(uintptr_t)h) & (HSLOTS - 1);
  for (uint32_t n = 0; n < HSLOTS; n++, i = (i + 1) & (HSLOTS - 1)) {
    const void *k = atomic_load_explicit(&handles[i].handle, memory_order_acquire);
    if (k == h) return &handles[i];
    if (!k) return NULL;
  }
  return NULL;
}


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
  if (dims & PROTO_DIMS_BLOCK) { memcpy(key + len, &block, 12); len += 12; }
  if (dims & PROTO_DIMS_GRID) { memcpy(key + len, &grid, 12); len += 12; }
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

static inline uint64_t key_hash(const kinfo *ki, CUcontext ctx, const uint8_t *key, uint32_t len) {
  return hash_bytes(key, len, (uint64_t)(uintptr_t)ki ^ mix64((uint64_t)(uintptr_t)ctx));
}

/* Keys are short: compared in place, not through a call into libc. */
static inline int key_equal(const uint8_t *a, const uint8_t *b, uint32_t n) {
  for (; n >= 8; a += 8, b += 8, n -= 8) {
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    if (x != y) return 0;
  }
  for (; n; a++, b++, n--) if (*a != *b) return 0;
  return 1;
}

/* A launch asks for the variant its kernel's latest hit found first: a loop that launches one
 * variant over and over (every argument it changes unfolded) skips the hash and the table's line. */
static inline sentry *find_variant(kinfo *ki, CUcontext ctx, const uint8_t *key, uint32_t len) {
  sentry *e = atomic_load_explicit(&ki->last, memory_order_acquire);
  if (e && e->ctx == ctx && e->keylen == len && key_equal(e->key, key, len)) return e;
  if ((e = variant_lookup(key_hash(ki, ctx, key, len), ki, ctx, key, len)))
    atomic_store_explicit(&ki->last, e, memory_order_release);
  return e;
}


#endif
