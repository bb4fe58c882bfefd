/* Unit tests of the HIP half of the shim, without a GPU or a HIP runtime: the device's
 * processor read from hipDeviceProp_t, the launch path's hit (no lock, no allocation, no
 * Python) and fallback, and a launch whose variant a compile thread is still compiling, which
 * takes the core's path as on CUDA. Built and run by tests/shim/test_hip_shim.py. */
#define _GNU_SOURCE
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_api.h"
#include "hip_api.h"
#include "hitpath.h"
#include "shim.h"

#include <assert.h>
#include <time.h>

static int failures;
#define EXPECT(cond) \
  do { \
    if (!(cond)) { \
      fprintf(stderr, "FAILED line %d: %s\n", __LINE__, #cond); \
      failures++; \
    } \
  } while (0)

/* Every allocation in this program is counted, to show the hit path makes none. */
extern void *__libc_malloc(size_t);
static _Atomic long mallocs;
void *malloc(size_t n) {
  atomic_fetch_add(&mallocs, 1);
  return __libc_malloc(n);
}

static void test_arch_from_props(void) {
  static unsigned char props[4096];
  char out[64];
  /* ROCm 5's layout: gcnArchName at its offset */
  memset(props, 0, sizeof props);
  strcpy((char *)props, "AMD Instinct MI210");
  strcpy((char *)props + HIP_GCN_ARCH_NAME_OFFSET, "gfx90a:sramecc+:xnack-");
  arch_from_props(props, sizeof props, out, sizeof out);
  EXPECT(!strcmp(out, "gfx90a:sramecc+:xnack-"));
  /* another layout: found wherever it is, as a whole string */
  memset(props, 0, sizeof props);
  strcpy((char *)props + 1200, "gfx942:sramecc+:xnack-");
  arch_from_props(props, sizeof props, out, sizeof out);
  EXPECT(!strcmp(out, "gfx942:sramecc+:xnack-"));
  /* "gfx" inside other text is not a processor; nor is a bare "gfx" */
  memset(props, 0, sizeof props);
  strcpy((char *)props + 10, "xgfx90a");
  strcpy((char *)props + 100, "gfx");
  strcpy((char *)props + HIP_GCN_ARCH_NAME_OFFSET, "gfx!");
  arch_from_props(props, sizeof props, out, sizeof out);
  EXPECT(out[0] == 0);
  /* an unterminated name at the very end is refused, not read past the buffer */
  memset(props, 'x', sizeof props);
  memcpy(props + sizeof props - 6, "gfx90a", 6);
  arch_from_props(props, sizeof props, out, sizeof out);
  EXPECT(out[0] == 0);
}

static hipError_t fake_get_device(int *dev) {
  *dev = 3;
  return HIP_SUCCESS;
}

static kinfo *hit_ki;
static hipFunction_t hit_result;
static void *call_pick(void *arg) {
  int n = 42;
  float f = 0.5f;
  void *ptr = (void *)0x1000;
  void *params[3] = {&n, &f, &ptr};
  hit_result = hip_pick(arg, params, (dim3){10, 1, 1}, (dim3){256, 1, 1}, NULL);
  return NULL;
}

static void test_hit_path_takes_no_lock_and_allocates_nothing(void) {
  real_hipGetDevice = fake_get_device;
  g_disable = 0;
  const void *stub = (const void *)0x5000;
  remember(stub, (const void *)0x6000, "k", OWNER_HIP_RUNTIME, (void *)0x7000);
  kinfo *ki = handle_lookup(stub);
  EXPECT(ki != NULL);
  hit_ki = ki;
  ki->nparams = 3;
  ki->sizes[0] = 4;
  ki->sizes[1] = 4;
  ki->sizes[2] = 8;
  atomic_store(&ki->fold[0], 1);
  atomic_store(&ki->fold[1], 1);
  atomic_store(&ki->dims_in_key, 1);
  atomic_store(&ki->state, K_ACTIVE);
  /* the variant the launch below asks for, on device 3 */
  int n = 42;
  float f = 0.5f;
  void *ptr = (void *)0x1000;
  void *params[3] = {&n, &f, &ptr};
  uint8_t key[MAX_KEY];
  int len = stable_key(ki, params, (dim3){10, 1, 1}, (dim3){256, 1, 1}, key);
  CUcontext dev = (CUcontext)(uintptr_t)4;
  pthread_mutex_lock(&jit_lock);
  variant_insert(new_entry(ki, dev, key, len, (CUfunction)0x77, 0));
  pthread_mutex_unlock(&jit_lock);

  /* jit_lock is held while another thread launches: a hit must not need it */
  pthread_mutex_lock(&jit_lock);
  pthread_t t;
  pthread_create(&t, NULL, call_pick, (void *)stub);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  int joined = pthread_timedjoin_np(t, NULL, &until) == 0;
  EXPECT(joined);
  pthread_mutex_unlock(&jit_lock);
  if (!joined) pthread_join(t, NULL);
  EXPECT(hit_result == (hipFunction_t)0x77);
  /* (the thread's own start allocated; the launch itself did not: run it again here) */
  long before = atomic_load(&mallocs);
  call_pick((void *)stub);
  EXPECT(atomic_load(&mallocs) == before);
  EXPECT(hit_result == (hipFunction_t)0x77);
  EXPECT(atomic_load(&ki->hits) == 2 && atomic_load(&ki->launches) == 2 && atomic_load(&ki->fallbacks) == 0);
  EXPECT(py_state == 0);   /* Python was never started */

  /* the same launch on another device is another variant: not a hit (here: no Python, so the original) */
  EXPECT(key_hash(ki, dev, key, len) != key_hash(ki, (CUcontext)(uintptr_t)1, key, len));

  /* a disabled kernel runs the original, counted as a fallback */
  atomic_store(&ki->state, K_DISABLED);
  call_pick((void *)stub);
  EXPECT(hit_result == NULL && atomic_load(&ki->fallbacks) == 1);
  /* a handle nobody registered: counted as unknown */
  uint64_t unknown = atomic_load(&unknown_launches);
  call_pick((void *)0x9999);
  EXPECT(hit_result == NULL && atomic_load(&unknown_launches) == unknown + 1);
  /* PROTEUS_DISABLE: nothing is even counted */
  g_disable = 1;
  atomic_store(&ki->state, K_ACTIVE);
  call_pick((void *)stub);
  EXPECT(hit_result == NULL && atomic_load(&ki->launches) == 3);
  g_disable = 0;
}

/* A variant still compiling (queued by an earlier launch's miss, platform.h's async path): with
 * PROTEUS_ASYNC_COMPILATION=auto a launch that asks for it again waits while its stream is busy
 * (hipStreamQuery) and gets the function the compile thread publishes; the stream's "not ready"
 * is not left for the app's hipGetLastError. With 1 it runs the original at once, counted as a
 * launch while compiling. */
static _Atomic int stream_queries, errors_left;
static hipError_t busy_query(hipStream_t s) {
  (void)s;
  atomic_fetch_add(&stream_queries, 1);
  atomic_store(&errors_left, 1);
  return HIP_ERROR_NOT_READY;
}
static hipError_t not_capturing(hipStream_t s, hipStreamCaptureStatus *st) {
  (void)s;
  *st = 0;
  return HIP_SUCCESS;
}
static hipError_t peek_error(void) { return atomic_load(&errors_left) ? HIP_ERROR_NOT_READY : HIP_SUCCESS; }
static hipError_t take_error(void) { return atomic_exchange(&errors_left, 0) ? HIP_ERROR_NOT_READY : HIP_SUCCESS; }
static sentry *compiling;
static void *compile_thread(void *arg) {
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  atomic_store(&compiling->fn, arg);
  atomic_store(&compiling->pending, 0);
  return NULL;
}
static void test_a_compiling_variant_is_waited_for_or_skipped(void) {
  EXPECT(gpu_claim(&hip_ops) && gpu == &hip_ops && !gpu_claim(&cuda_ops));   /* chosen once */
  real_hipGetDevice = fake_get_device;
  real_hipStreamQuery = busy_query;
  real_hipStreamIsCapturing = not_capturing;
  real_hipPeekAtLastError = peek_error;
  real_hipGetLastError = take_error;
  g_disable = 0;
  const void *stub = (const void *)0x5100;
  remember(stub, (const void *)0x6100, "c", OWNER_HIP_RUNTIME, (void *)0x7100);
  kinfo *ki = handle_lookup(stub);
  ki->nparams = 1;
  ki->sizes[0] = 4;
  atomic_store(&ki->fold[0], 1);
  atomic_store(&ki->state, K_ACTIVE);
  int n = 7;
  void *params[1] = {&n};
  uint8_t key[MAX_KEY];
  int len = stable_key(ki, params, (dim3){1, 1, 1}, (dim3){64, 1, 1}, key);
  pthread_mutex_lock(&jit_lock);
  compiling = new_entry(ki, (gpu_ctx)(uintptr_t)4, key, len, NULL, 1);
  variant_insert(compiling);
  pthread_mutex_unlock(&jit_lock);
  atomic_store(&ki->unserved, compiling->hash);   /* what the miss that queued it leaves */

  g_async = ASYNC_AUTO;
  pthread_t t;
  pthread_create(&t, NULL, compile_thread, (void *)0x99);
  hipFunction_t f = hip_pick(stub, params, (dim3){1, 1, 1}, (dim3){64, 1, 1}, (hipStream_t)0x5);
  pthread_join(t, NULL);
  EXPECT(f == (hipFunction_t)0x99 && atomic_load(&stream_queries) > 0 && atomic_load(&n_awaits) == 1);
  EXPECT(atomic_load(&ki->hits) == 1 && atomic_load(&ki->pending_launches) == 0 && atomic_load(&errors_left) == 0);
  f = hip_pick(stub, params, (dim3){1, 1, 1}, (dim3){64, 1, 1}, (hipStream_t)0x5);   /* from now on, a hit */
  EXPECT(f == (hipFunction_t)0x99 && atomic_load(&ki->hits) == 2);

  atomic_store(&compiling->fn, NULL);   /* compiling again, in upstream's asynchronous mode: no wait */
  atomic_store(&compiling->pending, 1);
  g_async = ASYNC_ON;
  int queries = atomic_load(&stream_queries);
  f = hip_pick(stub, params, (dim3){1, 1, 1}, (dim3){64, 1, 1}, (hipStream_t)0x5);
  EXPECT(f == NULL && atomic_load(&ki->pending_launches) == 1 && atomic_load(&stream_queries) == queries);
  g_async = -1;
}

int main(void) {
  test_arch_from_props();
  test_hit_path_takes_no_lock_and_allocates_nothing();
  test_a_compiling_variant_is_waited_for_or_skipped();
  if (failures) {
    fprintf(stderr, "%d failed\n", failures);
    return 1;
  }
  printf("HIP shim unit tests: all passed\n");
  return 0;
}
