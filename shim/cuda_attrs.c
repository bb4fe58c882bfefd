/* Function attributes the app sets on a kernel (cudaFuncSetAttribute and the cache config,
 * which reach the driver as cuFuncSet* or cuKernelSet*) apply to that function only, not to a
 * variant loaded from another image: a launch that relies on one (dynamic shared memory above
 * 48 KiB, a cluster size, a carveout) would fail on the variant, and the original would run.
 * So each one is recorded on the kernel, set on every variant already loaded, and set on each
 * variant as it loads (cuda_load).
 *
 * A variant loading at the instant the app sets one may miss it (it is published after
 * cuda_load, outside attr_lock); its launches then fail and run the original: the results stay
 * the app's, only that variant's speed is lost. */
#include "cuda_api.h"
#include "shim.h"

#define CACHE_CONFIG (-1)   /* recorded beside the attributes, as a pseudo-attribute */

static pthread_mutex_t attr_lock = PTHREAD_MUTEX_INITIALIZER;

/* A context-free kernel's variants are libraries' CUkernels, set per device; the others are
 * functions of a module in their context. dev < 0: the current context's device. */
static void set_one(kinfo *ki, CUfunction fn, int attrib, int value, int dev) {
  if (ki->ctx_free) {
    CUdevice d = dev;
    if (d < 0 && (!real_cuCtxGetDevice || real_cuCtxGetDevice(&d) != CUDA_SUCCESS)) return;
    if (attrib == CACHE_CONFIG) {
      if (real_cuKernelSetCacheConfig) real_cuKernelSetCacheConfig((CUkernel)fn, value, d);
    } else if (real_cuKernelSetAttribute) real_cuKernelSetAttribute(attrib, value, (CUkernel)fn, d);
  } else if (attrib == CACHE_CONFIG) {
    if (real_cuFuncSetCacheConfig) real_cuFuncSetCacheConfig(fn, value);
  } else if (real_cuFuncSetAttribute) {
    real_cuFuncSetAttribute(fn, attrib, value);
  }
}

void apply_attrs(kinfo *ki, CUfunction variant) {
  if (!ki->nattrs || !variant) return;   /* (read unlocked: most kernels never have one) */
  pthread_mutex_lock(&attr_lock);
  for (int i = 0; i < ki->nattrs; i++) set_one(ki, variant, ki->attrs[i].attrib, ki->attrs[i].value, ki->attrs[i].dev);
  pthread_mutex_unlock(&attr_lock);
}

typedef struct {
  int attrib, value, dev;
} attr_arg;

static void set_on_variant(sentry *e, void *arg) {
  const attr_arg *a = arg;
  CUfunction fn = atomic_load_explicit(&e->fn, memory_order_acquire);
  vcheck *c = atomic_load_explicit(&e->check, memory_order_acquire);   /* held for its check: set it too */
  if (!fn && c) fn = c->fn;
  if (fn) set_one(e->ki, fn, a->attrib, a->value, a->dev);
}

/* After the app's own call succeeded: keep the latest value per attribute and device. */
static void record(const void *handle, int attrib, int value, int dev) {
  kinfo *ki = handle_lookup(handle);
  if (!ki) return;
  pthread_mutex_lock(&attr_lock);
  int i = 0;
  while (i < ki->nattrs && !(ki->attrs[i].attrib == attrib && ki->attrs[i].dev == dev)) i++;
  if (i == MAX_ATTRS) {
    warn("%s: more than %d function attributes set; later ones are not carried to its variants", ki->name, MAX_ATTRS);
  } else {
    ki->attrs[i].attrib = attrib;
    ki->attrs[i].value = value;
    ki->attrs[i].dev = dev;
    if (i == ki->nattrs) ki->nattrs++;
    attr_arg a = {attrib, value, dev};
    for_each_variant(ki, set_on_variant, &a);
  }
  pthread_mutex_unlock(&attr_lock);
}

CUresult w_cuFuncSetAttribute(CUfunction f, int attrib, int value) {
  CUresult r = real_cuFuncSetAttribute(f, attrib, value);
  if (r == CUDA_SUCCESS) record(f, attrib, value, -1);
  return r;
}

CUresult w_cuFuncSetCacheConfig(CUfunction f, int config) {
  CUresult r = real_cuFuncSetCacheConfig(f, config);
  if (r == CUDA_SUCCESS) record(f, CACHE_CONFIG, config, -1);
  return r;
}

CUresult w_cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev) {
  CUresult r = real_cuKernelSetAttribute(attrib, value, k, dev);
  if (r == CUDA_SUCCESS) record(k, attrib, value, dev);
  return r;
}

CUresult w_cuKernelSetCacheConfig(CUkernel k, int config, CUdevice dev) {
  CUresult r = real_cuKernelSetCacheConfig(k, config, dev);
  if (r == CUDA_SUCCESS) record(k, CACHE_CONFIG, config, dev);
  return r;
}
