/* Speed trials (PROTEUS_SPEED_CHECK): a variant is kept only where it is not measured slower
 * than the kernel it replaces; and, with PROTEUS_TRACE_OUTPUT=cache-stats, each variant's
 * launches, for upstream's per-entry cache lines.
 *
 * A variant the caches have no verdict for (the run time sets PROTO_IMAGE_TRIAL in its answer)
 * takes turns with the original from its first launch: TRIAL_TURNS launches, the variant first
 * (the original first with PROTO_IMAGE_ORIGINAL_FIRST, where earlier runs timed the variant
 * more). Each turn is timed by a pair of events of its own, made with the trial, so that in a
 * GPU-bound loop the turns go back to back rather than one per drained queue. Both sides see
 * launches of one key, so what differs is the code. The verdict (judge) comes as soon as the
 * turns in show it, and at the latest once every turn is in: a slower variant is dropped, its
 * launches run the original from then on. A trial the run's launches leave undecided is handed
 * over with its times, and the run time adds the next run's to them (runtime/speed.py, which
 * judges by the same rule). What a trial costs: up to TRIAL_RUNS launches of the original per new
 * variant. Events come from the platform (platform.h); one without them (HIP) has no trials,
 * and with cache-stats its variants' launches are still counted. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "platform.h"
#include "shim.h"

_Static_assert(PROTO_VARIANT == 20 + 8 * TRIAL_RUNS + 8,
               "trial_records packs i32, 4 x u32, 2 x TRIAL_RUNS f32, u64 (protocol.VARIANT)");

int g_count_variants;
static pthread_mutex_t trial_lock = PTHREAD_MUTEX_INITIALIZER;
static trial *all_trials;
static int finished;   /* trial_lock: trial_finish has collected every turn, before the exit handlers */

/* A trial's events once no turn can use them (every claimed turn's launch is done): else 24 per
 * timed variant stayed for the life of the process. A verdict can come on a launch, so it only
 * queues the trial (spent); a later miss frees them (trial_release), off the hit path. */
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
  t->original_first = (flags & PROTO_IMAGE_ORIGINAL_FIRST) != 0;
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

static float median_of(const float *ms, uint32_t n) {
  float v[TRIAL_RUNS];
  memcpy(v, ms, sizeof(float) * n);
  qsort(v, n, sizeof *v, by_value);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The verdict on the times in (runtime/speed.py judge is the same rule). Decided early where the
 * sides do not overlap: every variant launch faster than every original one (kept), or slower
 * and beyond the noise floor (dropped); from one launch a side for a long kernel, two for a short
 * one. Once every turn is in (final), by the medians: slower when the variant's is above the
 * original's by more than TRIAL_MARGIN and TRIAL_FLOOR_MS and every variant launch is above the
 * original's median. The floor is for short kernels, whose event-timed span includes the launch's
 * own host-side latency when the stream was idle, and that differs between a variant launched by
 * its CUkernel and the original. */
static int judge(const float *o, uint32_t no, const float *v, uint32_t nv, int final) {
  if (!no || !nv) return TRIAL_RUNNING;
  float mo = median_of(o, no), mv = median_of(v, nv), gap = mv - mo;
  float omin = o[0], omax = o[0], vmin = v[0], vmax = v[0];
  for (uint32_t i = 1; i < no; i++) omin = o[i] < omin ? o[i] : omin, omax = o[i] > omax ? o[i] : omax;
  for (uint32_t i = 1; i < nv; i++) vmin = v[i] < vmin ? v[i] : vmin, vmax = v[i] > vmax ? v[i] : vmax;
  int beyond = gap > TRIAL_MARGIN * mo && gap > TRIAL_FLOOR_MS;
  uint32_t need = (mo < mv ? mo : mv) >= TRIAL_LONG_MS ? 1 : 2;
  if (no >= need && nv >= need) {
    if (vmax < omin) return TRIAL_KEPT;
    if (vmin > omax && beyond) return TRIAL_SLOWER;
  }
  if (!final) return TRIAL_RUNNING;
  return beyond && vmin > mo ? TRIAL_SLOWER : TRIAL_KEPT;
}

/* A verdict: no turn is claimed after it, and those claimed before keep their events until their
 * launches are done (trial_release). */
static void decide(trial *t, int verdict) {
  uint32_t before = atomic_fetch_add(&t->turns, TRIAL_TURNS);
  t->claimed = before < TRIAL_TURNS ? before : TRIAL_TURNS;
  if (verdict == TRIAL_SLOWER) atomic_store_explicit(&t->e->fn, NULL, memory_order_release);
  atomic_store(&t->verdict, verdict);
  t->next_spent = atomic_load_explicit(&spent, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&spent, &t->next_spent, t, memory_order_release, memory_order_relaxed)) {}
  if (!g_count_variants) atomic_store_explicit(&t->e->trial, NULL, memory_order_release);   /* hits inline again */
}

static int turns_done(trial *t) {
  for (uint32_t k = 0; k < t->claimed; k++)
    if (atomic_load_explicit(&t->turn_state[k], memory_order_acquire) == TURN_FREE) return 0;
  return 1;
}

void trial_release(void) {
  trial *keep = NULL;
  for (trial *t = atomic_exchange_explicit(&spent, NULL, memory_order_acquire), *next; t; t = next) {
    next = t->next_spent;
    if (turns_done(t)) {
      free_events(t);
      continue;
    }
    t->next_spent = keep;   /* a turn's launch still recording: the next miss looks again */
    keep = t;
  }
  while (keep) {
    trial *t = keep;
    keep = t->next_spent;
    t->next_spent = atomic_load_explicit(&spent, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&spent, &t->next_spent, t, memory_order_release, memory_order_relaxed)) {}
  }
}

/* Which side turn k runs: 1 the variant, 0 the original; they alternate from the trial's first. */
static int side_of(const trial *t, uint32_t k) { return (int)((k & 1) ^ (uint32_t)!t->original_first); }

/* Take in the turns the GPU has finished, in order, and judge; never waits. */
static void collect(trial *t) {
  if (pthread_mutex_trylock(&t->collect)) return;
  int verdict = TRIAL_RUNNING;
  while (t->collected < TRIAL_TURNS && atomic_load(&t->verdict) == TRIAL_RUNNING && verdict == TRIAL_RUNNING) {
    uint32_t k = t->collected;
    int st = atomic_load_explicit(&t->turn_state[k], memory_order_acquire);
    if (st == TURN_FREE) break;   /* not launched yet, or its launch not done */
    if (st == TURN_RECORDED) {
      int q = gpu->event_query(t->ev[2 * k + 1]);
      if (q == EVENT_PENDING) break;
      float ms = 0;
      int arm = side_of(t, k);
      if (q == EVENT_DONE && gpu->event_elapsed(&ms, t->ev[2 * k], t->ev[2 * k + 1]) && ms >= 0 && t->n[arm] < TRIAL_RUNS)
        t->ms[arm][t->n[arm]++] = ms;
    }
    t->collected++;
    verdict = judge(t->ms[0], t->n[0], t->ms[1], t->n[1], t->collected == TRIAL_TURNS);
  }
  if (atomic_load(&t->verdict) == TRIAL_RUNNING) {
    if (verdict != TRIAL_RUNNING) decide(t, verdict);
    else if (t->collected == TRIAL_TURNS) decide(t, TRIAL_ENDED);   /* turns lost: no verdict, the variant stays */
  }
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
    if (!atomic_load_explicit(&captures_open, memory_order_relaxed)) {
      uint32_t k = atomic_fetch_add_explicit(&t->turns, 1, memory_order_relaxed);
      if (k < TRIAL_TURNS) {
        tk->t = t;
        tk->turn = (int)k;
        if (!side_of(t, k)) {   /* the original's turn */
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
  finished = 1;
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
    /* turns the GPU finished since the last launch; none once trial_finish ran: the runtime's
     * exit handler has destroyed their events since, and a query of a destroyed event is the
     * driver's undefined behaviour */
    if (!finished && atomic_load(&t->verdict) == TRIAL_RUNNING) collect(t);
    int v = atomic_load(&t->verdict);
    int32_t kid = t->ki->kid;
    uint32_t u[4] = {t->vid, (uint32_t)(v == TRIAL_KEPT || v == TRIAL_SLOWER ? v : PROTO_TRIAL_UNDECIDED), t->n[0], t->n[1]};
    float us[2 * TRIAL_RUNS] = {0};   /* microseconds */
    for (int side = 0; side < 2; side++)
      for (uint32_t i = 0; i < t->n[side]; i++) us[side * TRIAL_RUNS + i] = t->ms[side][i] * 1000;
    uint64_t execs = atomic_load(&t->execs);
    memcpy(buf + *len, &kid, 4);
    memcpy(buf + *len + 4, u, sizeof u);
    memcpy(buf + *len + 20, us, sizeof us);
    memcpy(buf + *len + 20 + sizeof us, &execs, 8);
    *len += PROTO_VARIANT;
  }
  pthread_mutex_unlock(&trial_lock);
  return buf;
}
