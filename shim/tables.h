/* The tables' layout and hashing, shared by the hit path (hitpath.h), which probes them
 * lock-free, and tables.c, which fills them: the one header both include, so neither includes
 * the other. Everything here is inline and touches neither a lock nor the allocator. */
#ifndef PROTEUS_TABLES_H
#define PROTEUS_TABLES_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "shim.h"

#define HSLOTS (1u << 16)
#define SSLOTS (1u << 16)
/* Launch handles, open addressing: the handle and its kernel in the slot itself, so a hit finds
 * the kernel in the one line it probes. A slot is claimed once (handle written last, with
 * release) and never emptied; a handle registered again gets its new kernel in place. */
typedef struct {
  _Atomic(const void *) handle;
  _Atomic(kinfo *) ki;
} hslot;
HIDDEN extern hslot handles[HSLOTS];
HIDDEN extern _Atomic(void *) handle_owners[HSLOTS];
HIDDEN extern _Atomic(sentry *) variants[SSLOTS];

static inline uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/* Every hit hashes its launch's key, so the hash is a large share of a hit: a full mix64 per
 * 8-byte word cost more than the rest of a hit together (docs/dev/findings/hit-path.md, "The
 * key hash"). Here each word costs one multiply and one shift, on two independent lanes, and one
 * mix64 at the end spreads the result. Each step is a bijection of the lane, so keys of one
 * length that differ anywhere reach the final mix in different states. In-process only:
 * nothing stores these hashes. */
static inline uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t h) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint64_t a = h, b = ~h, len = n;
  for (; n >= 16; p += 16, n -= 16) {
    uint64_t v, w;
    memcpy(&v, p, 8);
    memcpy(&w, p + 8, 8);
    a = (a ^ v) * k;
    a ^= a >> 29;
    b = (b ^ w) * k;
    b ^= b >> 29;
  }
  if (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    a = (a ^ v) * k;
    a ^= a >> 29;
    p += 8;
    n -= 8;
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

static inline uint64_t key_hash(const kinfo *ki, gpu_ctx ctx, const uint8_t *key, uint32_t len) {
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
  for (; n; a++, b++, n--)
    if (*a != *b) return 0;
  return 1;
}

#endif
