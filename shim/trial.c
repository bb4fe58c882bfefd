/* Speed trials (PROTEUS_SPEED_CHECK): a variant is kept only where it is not measured slower
 * than the kernel it replaces.
 *
 * A variant the caches have no verdict for (the run time asks for a trial in its answer) runs
 * TRIAL_AFTER launches untimed, then takes turns with the original kernel, variant first, each
 * turn timed by the GPU-time sample's pair of events (cuda_api.h); launches between turns run
 * the variant. Both sides see the same
 * launches of one key, so what differs is the code. After TRIAL_RUNS timed launches a side, the
 * variant is dropped when its median and its minimum are both above the original's, the median
 * by more than TRIAL_MARGIN: its launches run the original from then on. The run time
 * remembers each verdict per variant in the cache (runtime/speed.py), so a later run times
 * nothing and never loads a variant found slower. What a trial costs: TRIAL_RUNS launches of
 * the original per new variant, in the run that first compiles it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "shim.h"

_Static_assert(PROTO_TRIAL == 32, "trial_records packs i32, 3 x u32, 4 x f32 (protocol.TRIAL)");

static pthread_mutex_t trial_lock = PTHREAD_MUTEX_INITIALIZER;
static trial *all_trials;

void trial_attach(kinfo *ki, sentry *e, uint32_t id, CUfunction fn) {
  /* HIP kernels and kernels without events take no GPU-time samples: nothing to time with */
  if (!id || !fn || !ki->ev[1] || atomic_load(&ki->sample_state) == SAMPLE_OFF) return;
  trial *t = calloc(1, sizeof *t);
  if (!t) return;
  t->ki = ki; t->e = e; t->vid = id - 1;
  pthread_mutex_lock(&trial_lock);
  t->next = all_trials;
  all_trials = t;
  pthread_mutex_unlock(&trial_lock);
  atomic_store_explicit(&e->trial, t, memory_order_release);
}

/* A hit on a variant under trial: which side this launch runs, and whether its sample times it.
 * A turn needs the events free, and in a GPU-bound loop the last turn's are free again only once
 * the launches queued before its end have run: a launch that cannot be timed runs the variant,
 * so that a trial costs a winning variant no more than the original's turns (running the
 * original between turns kept changing_scalars' 4,000 queued launches on the original almost
 * throughout). */
__attribute__((noinline)) CUfunction trial_pick(kinfo *ki, sentry *e, CUfunction fn, trial_ticket *tk) {
  trial *t = atomic_load_explicit(&e->trial, memory_order_acquire);
  sample_poll(ki);   /* the last turn's time, if the GPU has it: the events are then free for this one */
  if (t && atomic_load_explicit(&t->verdict, memory_order_relaxed) == TRIAL_RUNNING &&
      atomic_fetch_add_explicit(&t->launches, 1, memory_order_relaxed) >= TRIAL_AFTER &&
      atomic_load_explicit(&ki->sample_state, memory_order_relaxed) == SAMPLE_IDLE &&
      !atomic_load_explicit(&captures_open, memory_order_relaxed)) {
    int arm = (int)(atomic_fetch_add_explicit(&t->timed, 1, memory_order_relaxed) & 1) ^ 1;   /* the variant first */
    tk->t = t;
    tk->arm = arm;
    if (!arm) {
      atomic_fetch_add_explicit(&ki->timing, 1, memory_order_relaxed);
      return NULL;
    }
  }
  atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
  return fn;
}

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* One side's timed launches, its first left out: median and minimum. */
static void summarize(trial *t, int side) {
  float v[TRIAL_RUNS];
  int n = TRIAL_RUNS - 1;
  memcpy(v, t->ms[side] + 1, sizeof(float) * (size_t)n);
  qsort(v, (size_t)n, sizeof *v, by_value);
  t->median[side] = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  t->min[side] = v[0];
}

void trial_sample(kinfo *ki, float ms) {
  trial *t = ki->sample_trial;
  int arm = ki->sample_arm;
  ki->sample_trial = NULL;
  if (!t || atomic_load(&t->verdict) != TRIAL_RUNNING || t->n[arm] >= TRIAL_RUNS) return;
  t->ms[arm][t->n[arm]++] = ms;
  if (t->n[0] < TRIAL_RUNS || t->n[1] < TRIAL_RUNS) return;
  summarize(t, 0);
  summarize(t, 1);
  /* Slower beyond noise: by more than TRIAL_MARGIN and TRIAL_FLOOR_MS at the median, and every
   * counted launch of the variant above the original's median. The floor is for short kernels,
   * whose event-timed span includes the launch's own host-side latency when the stream was
   * idle, and that differs between a variant launched by its CUkernel and the original. */
  int slower = t->median[1] > t->median[0] * (1 + TRIAL_MARGIN) && t->median[1] - t->median[0] > TRIAL_FLOOR_MS &&
               t->min[1] > t->median[0];
  if (slower) atomic_store_explicit(&t->e->fn, NULL, memory_order_release);
  atomic_store(&t->verdict, slower ? TRIAL_SLOWER : TRIAL_KEPT);
  atomic_store_explicit(&t->e->trial, NULL, memory_order_release);
}

uint8_t *trial_records(size_t *len) {
  *len = 0;
  pthread_mutex_lock(&trial_lock);
  size_t n = 0;
  for (trial *t = all_trials; t; t = t->next) n++;
  uint8_t *buf = malloc(n * PROTO_TRIAL + 1);
  for (trial *t = all_trials; buf && t; t = t->next) {
    int32_t kid = t->ki->kid;
    uint32_t u[3] = {t->vid, (uint32_t)atomic_load(&t->verdict), t->n[0] + t->n[1]};
    /* microseconds; an undecided trial has no figures */
    float f[4] = {t->median[0] * 1000, t->min[0] * 1000, t->median[1] * 1000, t->min[1] * 1000};
    memcpy(buf + *len, &kid, 4);
    memcpy(buf + *len + 4, u, sizeof u);
    memcpy(buf + *len + 16, f, sizeof f);
    *len += PROTO_TRIAL;
  }
  pthread_mutex_unlock(&trial_lock);
  return buf;
}
