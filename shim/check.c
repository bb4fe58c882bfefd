/* A new variant's check before it serves (PROTEUS_VALIDATE, shim.h): the entry holds the variant
 * aside (e->check) until one launch has compared its results with the original's. That launch
 * is chosen here, off the hit path: a published entry is a plain hit, and an entry waiting for
 * its check has no function, so its launches already leave the hit path as a miss would.
 *
 * One thread checks a variant at a time (the claim); the launches of other threads meanwhile
 * run the original, counted (awaiting_check). By default a run spends at most
 * PROTEUS_VALIDATE_BUDGET of its time so far on checks, beyond a grace (PROTEUS_VALIDATE_GRACE_MS)
 * that lets the first ones through; a variant past the budget runs the original in this run, and
 * the next run checks it (the run time asks again until a check's verdict is stored). In full mode there is no budget. */
#include <stdatomic.h>
#include <stdlib.h>

#include "platform.h"
#include "shim.h"

#define BUDGET_DEFAULT 0.05
#define GRACE_MS_DEFAULT 250.0

int g_validate = VALIDATE_ONCE;   /* PROTEUS_VALIDATE (lifecycle.c read_env) */
__thread sentry *check_entry __attribute__((tls_model("initial-exec")));
static _Atomic uint64_t check_spent_ns;
_Atomic uint64_t t_check_phase_ns[CHECK_PHASES], n_checks_made;

void check_phase(int phase, uint64_t *since) {
  uint64_t now = now_ns();
  atomic_fetch_add_explicit(&t_check_phase_ns[phase], now - *since, memory_order_relaxed);
  *since = now;
}

uint64_t check_spent(void) { return atomic_load(&check_spent_ns); }
static double budget = -1, grace_ns;

void publish(sentry *e, gpu_fn fn, uint32_t vid, uint32_t flags) {
  vcheck *c = fn && (flags & PROTO_IMAGE_CHECK) && g_validate != VALIDATE_OFF && gpu->checks ? calloc(1, sizeof *c) : NULL;
  if (!c) {
    atomic_store_explicit(&e->fn, fn, memory_order_release);
    return;
  }
  c->fn = fn;
  c->vid = vid ? vid - 1 : 0;
  atomic_init(&c->state, CHECK_IDLE);
  atomic_store_explicit(&e->check, c, memory_order_release);
}

static int within_budget(void) {
  if (g_validate == VALIDATE_FULL) return 1;
  if (budget < 0) {
    const char *b = getenv(ENV_VALIDATE_BUDGET);
    double v = b && *b ? atof(b) : BUDGET_DEFAULT;
    budget = v >= 0 ? v : BUDGET_DEFAULT;
    const char *g = getenv(ENV_VALIDATE_GRACE_MS);
    double ms = g && *g ? atof(g) : GRACE_MS_DEFAULT;
    grace_ns = (ms >= 0 ? ms : GRACE_MS_DEFAULT) * 1e6;
  }
  uint64_t loaded = atomic_load(&t_loaded_ns), now = now_ns();
  double elapsed = loaded && now > loaded ? (double)(now - loaded) : 0;
  return (double)atomic_load(&check_spent_ns) <= budget * elapsed + grace_ns;
}

gpu_fn check_pick(kinfo *ki, sentry *e) {
  vcheck *c = atomic_load_explicit(&e->check, memory_order_acquire);
  if (!c) return atomic_load_explicit(&e->fn, memory_order_acquire);   /* checked meanwhile */
  int idle = CHECK_IDLE;
  if (atomic_load(&ki->state) != K_ACTIVE || !within_budget() ||
      !atomic_compare_exchange_strong(&c->state, &idle, CHECK_RUNNING)) {
    atomic_fetch_add_explicit(&ki->awaiting_check, 1, memory_order_relaxed);
    return NULL;
  }
  /* the app's own launch runs the original (validate_begin): counted so, not as a hit */
  atomic_fetch_add_explicit(&ki->awaiting_check, 1, memory_order_relaxed);
  check_entry = e;
  return c->fn;
}

void check_done(sentry *e, int outcome, uint64_t ns) {
  vcheck *c = atomic_load_explicit(&e->check, memory_order_acquire);
  atomic_fetch_add(&check_spent_ns, ns);
  if (outcome != CHECKED_LATER) atomic_fetch_add_explicit(&n_checks_made, 1, memory_order_relaxed);
  if (!c) return;
  if (outcome == CHECKED_LATER) {
    atomic_store(&c->state, CHECK_IDLE);
    return;
  }
  atomic_store(&c->state, CHECK_DONE);
  /* unchecked (it could not be compared): by default it runs as it would without the check; in
   * full mode the platform has denied the kernel for the run */
  if (outcome == CHECKED_SAME || (outcome == CHECKED_UNCHECKABLE && g_validate != VALIDATE_FULL))
    atomic_store_explicit(&e->fn, c->fn, memory_order_release);
  atomic_store_explicit(&e->check, NULL, memory_order_release);   /* (c stays allocated: a racing check_pick may read it) */
}
