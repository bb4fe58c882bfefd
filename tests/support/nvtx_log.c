/* An NVTX injection library, as a profiler is one: loaded through NVTX_INJECTION64_PATH, it takes
 * over the domain range push and pop and appends each to the file NVTX_LOG names
 * ("push <message>" / "pop", one line each, with the thread id). The tests read what a profiler's
 * timeline would show without needing Nsight Systems. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nvtx3/nvToolsExt.h"

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void line(const char *what, const char *text) {
  pthread_mutex_lock(&lock);
  if (out) {
    fprintf(out, "%ld %s%s%s\n", (long)syscall(SYS_gettid), what, text ? " " : "", text ? text : "");
    fflush(out);
  }
  pthread_mutex_unlock(&lock);
}

static int push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  (void)d;
  line("push", a && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "?");
  return 0;
}

static int pop(nvtxDomainHandle_t d) {
  (void)d;
  line("pop", NULL);
  return 0;
}

static nvtxDomainHandle_t create(const char *name) {
  line("domain", name);
  return (nvtxDomainHandle_t)(void *)1;
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  const char *path = getenv("NVTX_LOG");
  out = path ? fopen(path, "a") : NULL;
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table;
  unsigned size = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || size <= NVTX_CBID_CORE2_DomainRangePop) return 0;
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push;
  *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop;
  *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)create;
  return 1;
}
