/* Unit tests of the HIP half of the shim, without a GPU or a HIP runtime: the device's
 * processor read from hipDeviceProp_t, and the launch path's hit (no lock, no allocation, no
 * Python) and fallback. Built and run by tests/shim/test_hip_shim.py. */
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
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "FAILED line %d: %s\n", __LINE__, #cond); failures++; } } while (0)

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

static hipError_t fake_get_device(int *dev) { *dev = 3; return HIP_SUCCESS; }

static kinfo *hit_ki;
static hipFunction_t hit_result;
static void *call_pick(void *arg) {
  int n = 42; float f = 0.5f; void *ptr = (void *)0x1000;
  void *params[3] = {&n, &f, &ptr};
  hit_result = hip_pick(arg, params, (dim3){10, 1, 1}, (dim3){256, 1, 1});
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
  ki->nparams = 3; ki->sizes[0] = 4; ki->sizes[1] = 4; ki->sizes[2] = 8;
  atomic_store(&ki->fold[0], 1); atomic_store(&ki->fold[1], 1);
  atomic_store(&ki->dims_in_key, 1);
  atomic_store(&ki->state, K_ACTIVE);
  /* the variant the launch below asks for, on device 3 */
  int n = 42; float f = 0.5f; void *ptr = (void *)0x1000;
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

int main(void) {
  test_arch_from_props();
  test_hit_path_takes_no_lock_and_allocates_nothing();
  if (failures) { fprintf(stderr, "%d failed\n", failures); return 1; }
  printf("HIP shim unit tests: all passed\n");
  return 0;
}
