/* NVTX ranges, so that an Nsight Systems timeline shows what the JIT did and when: misses,
 * compilations, speed-trial turns and validation checks, in the "proteus-rewrite" domain.
 * Without a tool attached (no NVTX_INJECTION64_PATH), NVTX's first call finds none and every
 * later one is a call through a pointer to an empty function. Never on the hit path: a trial
 * turn's range is the one exception, and a turn is a few launches per variant. The headers are
 * kept in shim/nvtx3 so the shim needs no CUDA toolkit to build; only this file includes them. */
#include "shim.h"

#include <stdarg.h>
#include <stdio.h>

#include "nvtx3/nvToolsExt.h"

static nvtxDomainHandle_t domain(void) {
  static _Atomic(nvtxDomainHandle_t) d;
  nvtxDomainHandle_t h = atomic_load_explicit(&d, memory_order_acquire);
  if (!h) {   /* two threads may both create it: NVTX returns the same handle for one name */
    h = nvtxDomainCreateA("proteus-rewrite");
    atomic_store_explicit(&d, h, memory_order_release);
  }
  return h;
}

void prof_push(const char *fmt, ...) {
  char text[192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  nvtxEventAttributes_t a = {0};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = text;
  nvtxDomainRangePushEx(domain(), &a);
}

void prof_pop(void) { nvtxDomainRangePop(domain()); }
