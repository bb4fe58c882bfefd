/* The seam between the shim's core and the GPU platforms.
 *
 * The core (tables.c, python.c, trial.c, jobs.c, lifecycle.c) serves CUDA and HIP with one miss
 * path, one set of compile threads and one report, so it names no driver or runtime function:
 * what it needs of a GPU it asks of `gpu`, a table that cuda.c and hip.c each fill. A platform
 * file calls down into the core (the hit path, miss_variant, pick_miss, resolve_with); the core
 * never calls up except through this table. tests/shim/test_layers.py holds both rules.
 *
 * The platform is chosen once per process, by the first platform entry point the app calls
 * (gpu_claim: a registration, a module load, a static runtime's driver lookup, a launch's miss).
 * Until then CUDA's table answers (gpu_default, from cuda.c's constructor): an app whose static
 * CUDA runtime found no driver reaches no entry point at all, and its report must still say why.
 * A process that later calls the other platform too gets the original kernels on that one.
 *
 * Members that a platform leaves NULL are features it lacks, which the core skips: HIP has no
 * events here (so no GPU-time samples and no speed trials), no compiler warm-up (the run time
 * warms up NVPTX only), no loading of a warm run's variants ahead, and no "no GPU" report. */
#ifndef PROTEUS_PLATFORM_H
#define PROTEUS_PLATFORM_H

#include "shim.h"

enum { EVENT_DONE, EVENT_PENDING, EVENT_FAILED };   /* what an event query answers */

/* PROTEUS_PRELOAD (cuda_warm.c): the last run's variants answered by Python on the prestart
 * thread, and loaded at their kernel's first launch. */
struct gpu_preload {
  int (*enabled)(void);
  int (*scan)(void);                                 /* the prestart thread, before it takes jit_lock */
  void (*first)(void);                               /* the prestart thread, Python up, jit_lock held */
  void (*start)(void);                               /* then on that thread until `finish` */
  void (*resolve)(kinfo *ki, gpu_ctx ctx);           /* a kernel's first launch: jit_lock held */
  void (*finish)(void);                              /* before exit handlers */
  void (*atfork_child)(void);
};

struct gpu_ops {
  const char *name;
  /* runtime.prepare_compiler warms up this platform's code generation (NVPTX only): the
   * prestart thread, or the first compile job, does it before any variant */
  int compiler_warm_up;
  int (*driver_version)(void);                       /* for runtime.init; NULL: 0, unknown */
  /* The current device's architecture; 0 when it cannot be told (a warning is the platform's),
   * and its kernels then run as built. jit_lock held. */
  int (*arch)(gpu_arch *out);
  /* A kernel kernel_info described, before it turns K_ACTIVE: what the platform keeps per
   * kernel (ctx_free, the sample events, or sample_state SAMPLE_OFF). jit_lock held. */
  void (*kernel_ready)(kinfo *ki);
  int (*current_context)(gpu_ctx *ctx);              /* 1: *ctx is the calling thread's (may be NULL) */
  int (*set_context)(gpu_ctx ctx);                   /* a compile thread, before it loads a job's variant */
  void (*thread_init)(void);                         /* each of the shim's own threads that loads code (NULL: none) */
  /* A device variable's address for a launch through a handle of `owner` (NULL: the kernel's
   * first); 0 unknown. jit_lock held. */
  uint64_t (*global_address)(kinfo *ki, void *owner, const char *name);
  /* A variant's image (malloc'd: the platform frees it, or keeps it where the runtime may read
   * it later) loaded in the current context, and its entry point `name`: its function, or
   * NULL with *error the platform's code. */
  gpu_fn (*load)(kinfo *ki, uint8_t *image, const char *name, int *error);
  /* 1 while a launch into `s` would join a graph capture, 0 when not, -1 when it cannot be
   * told: either way that is not 0 means no event and no query on it (either would end the
   * capture, or join the graph). */
  int (*stream_capturing)(gpu_stream s);
  int (*stream_busy)(gpu_stream s);                  /* work still queued on it (never asked while it captures) */
  /* events, for GPU-time samples and speed trials (NULL: none on this platform) */
  int (*event_create)(void **ev);                    /* 1 made */
  void (*event_destroy)(void *ev);
  int (*event_record)(void *ev, gpu_stream s);       /* 1 recorded */
  int (*event_query)(void *ev);                      /* EVENT_* */
  int (*event_elapsed)(float *ms, void *start, void *end);   /* 1: *ms holds the time between them */
  void (*event_sync)(void *ev);
  /* Why the app had no usable GPU, for its report ("" where it had one or that cannot be told);
   * may_init: the driver may still be asked, which holds only before the exit handlers run. */
  const char *(*no_gpu_reason)(int may_init);
  const struct gpu_preload *preload;                 /* NULL: nothing is loaded ahead */
  /* 1: a variant's first launch can be checked against the original's (validate_begin and
   * validate_end at its launch sites, PROTEUS_VALIDATE); 0: its variants are published unchecked */
  int checks;
};

HIDDEN extern const struct gpu_ops *_Atomic gpu;
HIDDEN int gpu_claim(const struct gpu_ops *ops);     /* 1 where the process is (now) this platform's */
HIDDEN void gpu_default(const struct gpu_ops *ops);  /* the table until one is claimed */

#endif
