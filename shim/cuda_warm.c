/* A warm run's first launches (runtime/warm.py; PROTEUS_PRELOAD=0 turns it off): Python's answers
 * for the launches the app's last run noted, made on the prestart thread while the app creates
 * its context, so that a kernel's first launch loads its variants from them instead of asking
 * Python, which costs several times the load and lands inside the app's timed work
 * (docs/dev/findings/preload.md). CUDA's gpu_ops.preload.
 *
 * The thread learns of fat binaries from the .nvFatBinSegment sections of the objects loaded with
 * the app, and as the app's runtime registers or loads them (a static cudart names them to the
 * driver only once it has a context). It asks runtime.warm_set which launches of those the last
 * run noted; Python answers each as a first launch would be answered (kernel_info, and specialize
 * asking the caches only). That is all it does: it makes no driver call and touches no kernel.
 * A first launch (warm_resolve, on the app's thread, inside its miss) resolves its kernel with
 * the answer made ahead and loads the noted variants of that kernel, as a miss would. The
 * answers are made under jit_lock, so a first launch that comes meanwhile waits for them rather
 * than doing the same work beside them. The thread makes no driver call: driver work on a
 * second thread while the app's runtime still sets its context up was the one thing that runs
 * which crashed (cause never found) did and a plain miss never does (preload.md, "Why the
 * prestart thread does no driver work"),
 * and a first launch's load, on the app's own thread, costs little. Only images inside a loaded
 * object (dladdr) are read: an app's own buffer passed to cuModuleLoadData may be gone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "hitpath.h"
#include "shim.h"

#define WARM_IMAGES 256

static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t warm_cond = PTHREAD_COND_INITIALIZER;
/* warm_lock: the fat binaries seen, in order, each by its bytes' address (a wrapper's data) and
 * by the pointer the app's runtime gave the driver for it, which its kernels are remembered under
 * (the fat binary itself until the runtime names it, perhaps by its wrapper). */
static const void *warm_data[WARM_IMAGES];
static const void *warm_images[WARM_IMAGES];
static int n_warm_images;
static unsigned warm_events, warm_stop, warm_busy;

typedef struct {
  const uint8_t *rec;   /* protocol.WARM_ITEM, then name, known[], args, kernel_info's answer, the image answer */
  uint32_t dims[6], arch, nparams, nname, nargs, ninfo, nanswer;
  int image, done;      /* image: its index in warm_images */
} warm_item;

/* jit_lock: Python's answers for the noted launches (the blobs hold their bytes), for their
 * kernels' first launches to load (warm_resolve). */
static warm_item *items;
static int n_items, n_left;
static uint8_t *blobs[WARM_IMAGES];
static int n_blobs;

static void warm_event(void) {
  warm_events++;
  pthread_cond_broadcast(&warm_cond);
}

/* A fat binary seen (name: the runtime's pointer for it, else NULL), merged with what was seen
 * of it already: 1 if it is new. warm_lock held. */
static int add_image(const void *data, const void *name) {
  int i = 0;
  while (i < n_warm_images && warm_data[i] != data) i++;
  if (i == n_warm_images) {
    if (n_warm_images == WARM_IMAGES) return 0;
    n_warm_images++;
    warm_data[i] = data;
    warm_images[i] = name ? name : data;
    warm_event();
    return 1;
  }
  if (name) warm_images[i] = name;
  return 0;
}

/* A fat binary registered or loaded by the app's runtime. */
void warm_image(const void *image) {
  Dl_info info;
  if (!image || !dladdr(image, &info)) return;   /* not static data: it may not outlive the call */
  const fatbin_wrapper *w = image;
  const void *data = w->magic == FATBIN_WRAPPER_MAGIC && dladdr(w->data, &info) ? w->data : image;
  pthread_mutex_lock(&warm_lock);
  add_image(data, image);
  pthread_mutex_unlock(&warm_lock);
}

static int mapped(const struct dl_phdr_info *info, const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R) && a >= start && a + n >= a && a + n <= start + ph->p_memsz) return 1;
  }
  return 0;
}

/* One loaded object's fat binaries, from its file's section headers: each wrapper read where the
 * object is mapped, and taken only if it and the fat binary it points to are inside the object's
 * segments and carry their magic numbers (a file replaced on disk since it was loaded reads as
 * nothing). */
static int scan_object(struct dl_phdr_info *info, size_t size, void *found) {
  (void)size;
  const char *path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ElfW(Ehdr) eh;
  ElfW(Shdr) *sh = NULL;
  char *names = NULL;
  if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_shentsize != sizeof *sh ||
      !eh.e_shnum || eh.e_shstrndx >= eh.e_shnum)
    goto done;
  size_t bytes = (size_t)eh.e_shnum * sizeof *sh;
  if (!(sh = malloc(bytes)) || pread(fd, sh, bytes, eh.e_shoff) != (ssize_t)bytes) goto done;
  const ElfW(Shdr) *str = &sh[eh.e_shstrndx];
  if (str->sh_size > (1u << 20) || !(names = malloc(str->sh_size + 1)) ||
      pread(fd, names, str->sh_size, str->sh_offset) != (ssize_t)str->sh_size)
    goto done;
  names[str->sh_size] = 0;
  for (int i = 0; i < eh.e_shnum; i++) {
    if (sh[i].sh_name >= str->sh_size || strcmp(names + sh[i].sh_name, ".nvFatBinSegment") || !(sh[i].sh_flags & SHF_ALLOC))
      continue;
    for (size_t off = 0; off + sizeof(fatbin_wrapper) <= sh[i].sh_size; off += sizeof(fatbin_wrapper)) {
      const fatbin_wrapper *w = (const void *)(info->dlpi_addr + sh[i].sh_addr + off);
      if ((uintptr_t)w % _Alignof(fatbin_wrapper) || !mapped(info, w, sizeof *w) || w->magic != FATBIN_WRAPPER_MAGIC ||
          !mapped(info, w->data, 16) || *(const uint32_t *)w->data != FATBIN_MAGIC)
        continue;
      pthread_mutex_lock(&warm_lock);
      *(int *)found += add_image(w->data, NULL);
      pthread_mutex_unlock(&warm_lock);
    }
  }
done:
  free(sh);
  free(names);
  close(fd);
  return 0;
}

/* The fat binaries of the objects loaded now (the app and the libraries it links): how many were
 * not known yet. */
int warm_scan(void) {
  int found = 0;
  dl_iterate_phdr(scan_object, &found);
  return found;
}

/* How many fat binaries the app has: its loaded objects' and those its runtime named. */
int fatbins_seen(void) {
  warm_scan();
  pthread_mutex_lock(&warm_lock);
  int n = n_warm_images;
  pthread_mutex_unlock(&warm_lock);
  return n;
}

/* At exit, before any handler: the thread stops, and is out of the driver and Python. */
void warm_finish(void) {
  pthread_mutex_lock(&warm_lock);
  warm_stop = 1;
  pthread_cond_broadcast(&warm_cond);
  while (warm_busy) pthread_cond_wait(&warm_cond, &warm_lock);
  pthread_mutex_unlock(&warm_lock);
}

/* fork: the child has no prestart thread; whatever it held is free, and nothing is loaded ahead. */
void warm_atfork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
  warm_lock = fresh;
  warm_cond = fresh_cond;
  warm_busy = 0;
  warm_stop = 1;
  items = NULL;   /* (the parent's; left, not freed: the child loads nothing ahead) */
  n_items = n_left = n_blobs = 0;
}

/* A seen fat binary's name, as the runtime has named it so far. */
static const void *seen_image(int i) {
  pthread_mutex_lock(&warm_lock);
  const void *image = warm_images[i];
  pthread_mutex_unlock(&warm_lock);
  return image;
}

/* Load one noted launch's variant of `ki`, its kernel, in the launching thread's context. Python
 * answered for it ahead (runtime.warm_set); here only the driver is asked (and Python only for
 * a refused image). jit_lock held. */
static void preload(warm_item *it, kinfo *ki, CUcontext ctx, int arch) {
  const uint8_t *p = it->rec + PROTO_WARM_ITEM;
  const uint8_t *known = p + it->nname, *args = known + it->nparams, *info = args + it->nargs, *answer = info + it->ninfo;
  /* Only on the architecture the answers were made for (the last run's), and for the kernel id
   * Python gave the kernel with them: a kernel a launch resolved through Python has another. */
  uint32_t kid;
  memcpy(&kid, info + 4 * PROTO_KINFO_KID, 4);
  if (arch != (int)it->arch) return;
  if (atomic_load(&ki->state) == K_UNRESOLVED) resolve_with(ki, info, it->ninfo);
  else if (ki->kid != (int)kid) return;
  if (atomic_load(&ki->state) != K_ACTIVE || ki->nglobals || ki->nparams != it->nparams || ki->nparams > MAX_PARAMS) return;
  void *params[MAX_PARAMS];
  size_t off = 0;
  for (uint32_t i = 0; i < ki->nparams; off += ki->sizes[i], i++) {
    if (atomic_load(&ki->fold[i]) && !known[i]) return;   /* this run folds what the last did not note */
    params[i] = (void *)(args + off);
  }
  if (off != it->nargs) return;
  dim3 grid = {it->dims[0], it->dims[1], it->dims[2]}, block = {it->dims[3], it->dims[4], it->dims[5]};
  uint8_t key[MAX_KEY];
  int len = build_key(ki, params, grid, block, key, atomic_load(&ki->gen));
  CUcontext kctx = ki->ctx_free ? NULL : ctx;
  if (len < 0 || find_variant(ki, kctx, key, len)) return;
  answer_meta meta = {0, 0};
  CUfunction fn = load_answer(ki, answer, it->nanswer, &meta);
  if (fn) {
    sentry *ne = new_entry(ki, kctx, key, len, NULL, 0);
    if (ne) {
      trial_attach(ki, ne, meta.vid, meta.flags, fn);
      publish(ne, fn, meta.vid, meta.flags);
      variant_insert(ne);
      atomic_fetch_add(&n_preloaded, 1);
    }
  }
}

/* A kernel's first launch: the noted variants of it loaded from the answers made ahead, so that
 * the launch asks Python nothing, and the kernel keeps the one id Python gave it with them.
 * jit_lock held. */
void warm_resolve(kinfo *ki, CUcontext ctx) {
  if (!n_left || !ki->name) return;
  gpu_arch a = {0, NULL};
  gpu->arch(&a);   /* through the seam: cuda.c calls into this file, and a call back would make a loop */
  int arch = a.sm;
  size_t len = strlen(ki->name);
  for (int i = 0; i < n_items; i++) {
    warm_item *it = &items[i];
    if (it->done || it->nname != len || memcmp(it->rec + PROTO_WARM_ITEM, ki->name, len) || seen_image(it->image) != ki->image)
      continue;
    preload(it, ki, ctx, arch);
    it->done = 1;
    n_left--;
  }
}

/* Python's answer for the images ask[0..n) (warm_images[first..first+n)): its items appended.
 * 1 if any was kept (the blob is then theirs). jit_lock held. */
static int take_items(uint8_t *blob, ssize_t len, const uint64_t *ask, int n, int first) {
  int kept = 0;
  for (size_t at = 0; blob && at + PROTO_WARM_ITEM <= (size_t)len;) {
    uint64_t image;
    uint32_t h[12];
    memcpy(&image, blob + at, 8);
    memcpy(h, blob + at + 8, sizeof h);
    size_t next = at + PROTO_WARM_ITEM + (size_t)h[7] + h[8] + h[9] + h[10] + h[11];
    int k = 0;
    while (k < n && ask[k] != image) k++;
    warm_item *grown = next <= (size_t)len && k < n ? realloc(items, (n_items + 1) * sizeof *items) : NULL;
    if (!grown) break;
    items = grown;
    warm_item *it = &grown[n_items++];
    it->rec = blob + at;
    memcpy(it->dims, h, sizeof it->dims);
    it->arch = h[6];
    it->nparams = h[7];
    it->nname = h[8];
    it->nargs = h[9];
    it->ninfo = h[10];
    it->nanswer = h[11];
    it->image = first + k;
    it->done = 0;
    kept++;
    n_left++;
    at = next;
  }
  return kept;
}

static int asked;   /* jit_lock: warm_images[0..asked) asked about */

int warm_enabled(void) {   /* PROTEUS_PRELOAD, read as PROTEUS_PRESTART is: on unless 0, false or no */
  const char *p = getenv(ENV_PRELOAD);
  return !(p && (p[0] == '0' || p[0] == 'f' || p[0] == 'F' || p[0] == 'n' || p[0] == 'N'));
}

/* Python's answers for the fat binaries seen and not asked about yet. jit_lock held. */
static void ask_new(void) {
  uint64_t ask[WARM_IMAGES];
  pthread_mutex_lock(&warm_lock);
  int n = 0, first = asked;
  for (; asked < n_warm_images; asked++) ask[n++] = (uint64_t)(uintptr_t)warm_images[asked];
  pthread_mutex_unlock(&warm_lock);
  if (!n || n_blobs == WARM_IMAGES) return;
  ssize_t len = 0;
  uint8_t *blob = py_warm_set(ask, n, &len);
  if (take_items(blob, len, ask, n, first)) blobs[n_blobs++] = blob;
  else free(blob);
}

/* On the prestart thread as soon as Python is up, still holding jit_lock: the answers for the
 * fat binaries seen so far (the scan's, made before the lock: dl_iterate_phdr takes the
 * loader's), before any of the app's launches can miss. The compiler's warm-up comes after: a
 * warm run's first launch can come before answers that wait for it (docs/dev/findings/preload.md,
 * "Why the answers come before the warm-up"). */
void warm_first(void) {
  pthread_mutex_lock(&warm_lock);
  int stopped = warm_stop;
  warm_busy = !stopped;
  pthread_mutex_unlock(&warm_lock);
  if (stopped) return;
  ask_new();
  pthread_mutex_lock(&warm_lock);
  warm_busy = 0;
  pthread_cond_broadcast(&warm_cond);
  pthread_mutex_unlock(&warm_lock);
}

/* The prestart thread, after the compiler's warm-up, until exit: answers for the fat binaries
 * the app's runtime loads from here on. */
void warm_start(void) {
  if (!warm_enabled()) return;
  unsigned seen = 0;
  pthread_mutex_lock(&warm_lock);
  for (;;) {
    while (!warm_stop && seen == warm_events) pthread_cond_wait(&warm_cond, &warm_lock);
    if (warm_stop) break;
    seen = warm_events;
    warm_busy = 1;
    pthread_mutex_unlock(&warm_lock);
    pthread_mutex_lock(&jit_lock);
    ask_new();
    pthread_mutex_unlock(&jit_lock);
    pthread_mutex_lock(&warm_lock);
    warm_busy = 0;
    pthread_cond_broadcast(&warm_cond);
  }
  pthread_mutex_unlock(&warm_lock);
  pthread_mutex_lock(&jit_lock);   /* (a launch during exit may still look) */
  for (int i = 0; i < n_blobs; i++) free(blobs[i]);
  free(items);
  items = NULL;
  n_items = n_left = n_blobs = 0;
  pthread_mutex_unlock(&jit_lock);
}

const struct gpu_preload cuda_preload = {
    .enabled = warm_enabled,
    .scan = warm_scan,
    .first = warm_first,
    .start = warm_start,
    .resolve = warm_resolve,
    .finish = warm_finish,
    .atfork_child = warm_atfork_child,
};
