/* Speed trials (PROTEUS_SPEED_CHECK): a variant is kept only where it is not measured slower
 * than the kernel it replaces; and, with PROTEUS_TRACE_OUTPUT=cache-stats, each variant's
 * launches, for upstream's per-entry cache lines.
 *
 * A variant the caches have no verdict for (the run time sets PROTO_IMAGE_TRIAL in its answer)
 * runs TRIAL_AFTER launches untimed, then its next TRIAL_TURNS launches take turns with the
 * original kernel, variant first. Each turn is timed by a pair of events of its own, made with
 * the trial, so that in a GPU-bound loop the turns go back to back rather than one per drained
 * queue. Both sides see launches of one key, so what differs is the code. Once every turn's time
 * is in, the variant is dropped when it is slower beyond noise (collect): its launches run the
 * original from then on. The run time remembers each verdict per variant in the cache
 * (runtime/speed.py), so a later run times nothing and never loads a variant found slower. What
 * a trial costs: TRIAL_RUNS launches of the original per new variant, in the run that first
 * compiles it. Events come from the platform (platform.h); one without them (HIP) has no trials,
 * and with cache-stats its variants' launches are still counted. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "platform.h"
#include "shim.h"

_Static_assert(PROTO_VARIANT == 40, "trial_records packs i32, 3 x u32, 4 x f32, u64 (protocol.VARIANT)");

int g_count_variants;
static pthread_mutex_t trial_lock = PTHREAD_MUTEX_INITIALIZER;
static trial *all_trials;

/* A trial's events once no turn can use them (every turn's launch is done): else 24 per timed
 * variant stayed for the life of the process. A verdict can come on a launch, so it only queues
 * the trial (spent); the next miss frees them (trial_release), off the hit path. */
static _Atomic(trial *) spent;

static void free_events(trial *t) {
  for (int i = 0; i < 2 * TRIAL_TURNS; i++) {
    if (t->ev[i] && gpu->event_destroy) gpu->event_destroy(t->ev[i]);
    t->ev[i] = NULL;
  }
}

void trial_attach(kinfo *ki, sentry *e, uint32_t vid, uint32_t flags, gpu_fn fn) {
  if (!vid || !fn) return;
  /* kernels without sample events (none made, or a platform without events) have nothing to
   * time with */
  const struct gpu_ops *platform = gpu;
  int timed = (flags & PROTO_IMAGE_TRIAL) && ki->ev[1] && atomic_load(&ki->sample_state) != SAMPLE_OFF && platform->event_create;
  if (!timed && !g_count_variants) return;
  trial *t = calloc(1, sizeof *t);
  if (!t) return;
  t->ki = ki;
  t->e = e;
  t->vid = vid - 1;
  pthread_mutex_init(&t->collect, NULL);
  if (timed && platform->current_context(&t->ctx) && t->ctx) {
    t->timed_trial = 1;
    for (int i = 0; i < 2 * TRIAL_TURNS && t->timed_trial; i++)
      if (!platform->event_create(&t->ev[i])) {
        t->ev[i] = NULL;
        t->timed_trial = 0;
      }
    if (!t->timed_trial) free_events(t);   /* those made before the one that failed */
  }
  atomic_init(&t->verdict, t->timed_trial ? TRIAL_RUNNING : TRIAL_ENDED);
  pthread_mutex_lock(&trial_lock);
  t->next = all_trials;
  all_trials = t;
  pthread_mutex_unlock(&trial_lock);
  atomic_store_explicit(&e->trial, t, memory_order_release);
}

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* One side's timed launches, its first left out: median and minimum. */
static int summarize(trial *t, int side) {
  float v[TRIAL_RUNS];
  if (t->n[side] < 3) return 0;
  int n = (int)t->n[side] - 1;
  memcpy(v, t->ms[side] + 1, sizeof(float) * (size_t)n);
  qsort(v, (size_t)n, sizeof *v, by_value);
  t->median[side] = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  t->min[side] = v[0];
  return 1;
}

/* The verdict, once every turn is timed or lost. Slower beyond noise: by more than
 * TRIAL_MARGIN and TRIAL_FLOOR_MS at the median, and every counted launch of the variant above
 * the original's median. The floor is for short kernels, whose event-timed span includes the
 * launch's own host-side latency when the stream was idle, and that differs between a variant
 * launched by its CUkernel and the original. */
static void decide(trial *t) {
  int verdict = TRIAL_ENDED;
  if (summarize(t, 0) && summarize(t, 1)) {
    int slower = t->median[1] > t->median[0] * (1 + TRIAL_MARGIN) && t->median[1] - t->median[0] > TRIAL_FLOOR_MS &&
                 t->min[1] > t->median[0];
    verdict = slower ? TRIAL_SLOWER : TRIAL_KEPT;
    if (slower) atomic_store_explicit(&t->e->fn, NULL, memory_order_release);
  }
  atomic_store(&t->verdict, verdict);
  /* collected to the last turn: every turn's launch has recorded its pair */
  t->next_spent = atomic_load_explicit(&spent, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&spent, &t->next_spent, t, memory_order_release, memory_order_relaxed)) {}
  if (!g_count_variants) atomic_store_explicit(&t->e->trial, NULL, memory_order_release);   /* hits inline again */
}

void trial_release(void) {
  for (trial *t = atomic_exchange_explicit(&spent, NULL, memory_order_acquire); t; t = t->next_spent) free_events(t);
}

/* Take in the turns the GPU has finished, in order; never waits. */
static void collect(trial *t) {
  if (pthread_mutex_trylock(&t->collect)) return;
  while (t->collected < TRIAL_TURNS && atomic_load(&t->verdict) == TRIAL_RUNNING) {
    uint32_t k = t->collected;
    int st = atomic_load_explicit(&t->turn_state[k], memory_order_acquire);
    if (st == TURN_FREE) break;   /* not launched yet, or its launch not done */
    if (st == TURN_RECORDED) {
      int q = gpu->event_query(t->ev[2 * k + 1]);
      if (q == EVENT_PENDING) break;
      float ms = 0;
      int arm = (int)(k & 1) ^ 1;   /* the variant first */
      if (q == EVENT_DONE && gpu->event_elapsed(&ms, t->ev[2 * k], t->ev[2 * k + 1]) && ms >= 0 && t->n[arm] < TRIAL_RUNS)
        t->ms[arm][t->n[arm]++] = ms;
    }
    t->collected++;
  }
  if (t->collected == TRIAL_TURNS && atomic_load(&t->verdict) == TRIAL_RUNNING) decide(t);
  pthread_mutex_unlock(&t->collect);
}

/* A hit on a variant followed: counted (cache-stats); under trial, which side this launch runs
 * and which turn it times. Launches after the turns run the variant until the verdict. */
__attribute__((noinline)) gpu_fn trial_pick(kinfo *ki, sentry *e, gpu_fn fn, trial_ticket *tk) {
  trial *t = atomic_load_explicit(&e->trial, memory_order_acquire);
  if (!t) goto variant;
  /* a launch of its key, whichever side runs: upstream counts each as a use of the entry */
  if (g_count_variants) atomic_fetch_add_explicit(&t->execs, 1, memory_order_relaxed);
  if (atomic_load_explicit(&t->verdict, memory_order_relaxed) == TRIAL_RUNNING) {
    collect(t);
    if (atomic_fetch_add_explicit(&t->launches, 1, memory_order_relaxed) >= TRIAL_AFTER &&
        !atomic_load_explicit(&captures_open, memory_order_relaxed)) {
      uint32_t k = atomic_fetch_add_explicit(&t->turns, 1, memory_order_relaxed);
      if (k < TRIAL_TURNS) {
        tk->t = t;
        tk->turn = (int)k;
        if (k & 1) {   /* the original's turn */
          atomic_fetch_add_explicit(&ki->timing, 1, memory_order_relaxed);
          return NULL;
        }
      }
    }
  }
  if (atomic_load_explicit(&e->fn, memory_order_acquire) == NULL) {   /* dropped meanwhile */
    atomic_fetch_add_explicit(&ki->fallbacks, 1, memory_order_relaxed);
    return NULL;
  }
variant:
  atomic_fetch_add_explicit(&ki->hits, 1, memory_order_relaxed);
  return fn;
}

void variant_ran(sentry *e) {
  trial *t = atomic_load_explicit(&e->trial, memory_order_acquire);
  if (t && g_count_variants) atomic_fetch_add_explicit(&t->execs, 1, memory_order_relaxed);
}

/* Around the launch of a turn: its events, on the launch's stream, in the trial's context. */
void turn_begin(trial_ticket *tk, gpu_stream s) {
  gpu_ctx ctx = NULL;
  trial *t = tk->t;
  const struct gpu_ops *platform = gpu;
  prof_push("proteus-rewrite speed trial: %s, turn %d", t->ki->name ? t->ki->name : "?", tk->turn);
  tk->recorded = !atomic_load_explicit(&captures_open, memory_order_relaxed) && platform->current_context(&ctx) &&
                 ctx == t->ctx && platform->stream_capturing(s) == 0 && platform->event_record(t->ev[2 * tk->turn], s);
}

void turn_end(trial_ticket *tk, gpu_stream s) {
  trial *t = tk->t;
  int ok = tk->recorded && gpu->event_record(t->ev[2 * tk->turn + 1], s);
  atomic_store_explicit(&t->turn_state[tk->turn], ok ? TURN_RECORDED : TURN_FAILED, memory_order_release);
  prof_pop();
}

/* Before any exit handler (lifecycle.c before_exit): the turns still queued on the GPU are waited
 * for and judged now. The report collects at the library's destructor, which runs after the
 * app's runtime's own exit handler has torn its context down, events and all; a variant whose
 * turns sat behind a deep queue would be left undecided there, and every later run would time
 * it again (docs/dev/findings/speed-trials.md, "Why judge before the exit handlers"). The
 * wait is for launches the turns followed, all queued long before: the driver's teardown would
 * wait for them too. */
void trial_finish(void) {
  const struct gpu_ops *platform = gpu;
  if (!platform || !platform->event_sync) return;
  pthread_mutex_lock(&trial_lock);
  for (trial *t = all_trials; t; t = t->next) {
    if (atomic_load(&t->verdict) != TRIAL_RUNNING) continue;
    uint32_t claimed = atomic_load(&t->turns);
    for (uint32_t k = 0; k < claimed && k < TRIAL_TURNS; k++)   /* (those collected already are done) */
      if (atomic_load_explicit(&t->turn_state[k], memory_order_acquire) == TURN_RECORDED) platform->event_sync(t->ev[2 * k + 1]);
    collect(t);
  }
  pthread_mutex_unlock(&trial_lock);
}

uint8_t *trial_records(size_t *len) {
  *len = 0;
  pthread_mutex_lock(&trial_lock);
  size_t n = 0;
  for (trial *t = all_trials; t; t = t->next) n++;
  uint8_t *buf = malloc(n * PROTO_VARIANT + 1);
  for (trial *t = all_trials; buf && t; t = t->next) {
    if (atomic_load(&t->verdict) == TRIAL_RUNNING) collect(t);   /* turns the GPU finished since the last launch */
    int v = atomic_load(&t->verdict);
    int32_t kid = t->ki->kid;
    uint32_t u[3] = {t->vid, (uint32_t)(v == TRIAL_KEPT || v == TRIAL_SLOWER ? v : PROTO_TRIAL_UNDECIDED), t->n[0] + t->n[1]};
    int decided = v == TRIAL_KEPT || v == TRIAL_SLOWER;   /* microseconds; no figures without a verdict */
    float f[4] = {decided ? t->median[0] * 1000 : 0, decided ? t->min[0] * 1000 : 0, decided ? t->median[1] * 1000 : 0,
                  decided ? t->min[1] * 1000 : 0};
    uint64_t execs = atomic_load(&t->execs);
    memcpy(buf + *len, &kid, 4);
    memcpy(buf + *len + 4, u, sizeof u);
    memcpy(buf + *len + 16, f, sizeof f);
    memcpy(buf + *len + 32, &execs, 8);
    *len += PROTO_VARIANT;
  }
  pthread_mutex_unlock(&trial_lock);
  return buf;
}
