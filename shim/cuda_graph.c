/* CUDA graphs: kernel nodes run specialized (design: docs/dev/graph-nodes.md).
 *
 * The driver launches a graph's kernel nodes at each replay, through no call the shim sees,
 * and the app may give a node other arguments later. So the template graph stays as the app
 * made it (an app that reads a node's parameters back gets its own function and arguments),
 * and only instantiated graphs are pointed at variants:
 *  - at instantiation, each kernel node of a recorded kernel gets the variant for its
 *    arguments and dimensions where one is loaded; where none is, it is compiled (here with
 *    PROTEUS_ASYNC_COMPILATION=0, else queued) and the node waits (`waiting`);
 *  - the app's cuGraphExec(Kernel)NodeSetParams gets the variant for its new arguments, or the
 *    original it passed while that variant compiles: a node never runs code with other values
 *    folded in than its arguments;
 *  - a waiting node gets its variant at its exec's next cuGraphLaunch after it landed, not from
 *    the compile thread: graph objects are not thread-safe, and the app may be launching or
 *    updating that exec at the same moment;
 *  - cuGraphExecUpdate is given a copy of the app's graph whose kernel nodes run the variants
 *    loaded for their arguments: the driver pairs the new graph's nodes with the exec's and
 *    says not how, so a copy it pairs the same way is the one way to reach them. A node whose
 *    variant is still compiling runs the original until the next update.
 * A template's node handles are valid only while it lives (cuGraphExecKernelNodeSetParams), so
 * a template destroyed while one of its nodes waits is destroyed when that wait ends.
 * Left as built: graphs instantiated for device launch, device-updatable nodes (the device may
 * change their arguments), nodes of child graphs, arguments passed through `extra`, and every
 * node while PROTEUS_VALIDATE is on (no shadow launch checks a replay). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "hitpath.h"
#include "shim.h"

#define NODE_KERNEL 0                 /* CU_GRAPH_NODE_TYPE_KERNEL */
#define ATTR_DEVICE_UPDATABLE 13      /* CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE */
#define INSTANTIATE_DEVICE_LAUNCH 4   /* CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH */

typedef struct {   /* CUDA_GRAPH_INSTANTIATE_PARAMS */
  unsigned long long flags;
  CUstream upload;
  void *err_node;
  int result;
} instantiate_params;

typedef struct {   /* CUgraphNodeParams: a type, then a union of 232 bytes */
  int type;
  int reserved0[3];
  union {
    long long reserved1[29];
    knode kernel;
  };
  long long reserved2;
} node_params;
_Static_assert(sizeof(node_params) == 256, "CUgraphNodeParams");

/* A node waiting for its variant, with its own copy of the arguments: the app's may be gone by
 * the time the variant lands. */
typedef struct waiting {
  struct waiting *next;
  void *exec, *graph, *node;
  kinfo *ki;
  sentry *e;
  knode p;       /* p.params points at argv */
  void *argv[];  /* nparams pointers, then the arguments' bytes */
} waiting;

/* An exec and the template it came from (the graph its SetParams nodes belong to). */
typedef struct exec_rec {
  struct exec_rec *next;
  void *exec, *graph;
} exec_rec;
typedef struct doomed {
  struct doomed *next;
  void *graph;
} doomed;

static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static waiting *waits;
static exec_rec *execs;
static doomed *dooms;
static _Atomic int nwaiting;   /* read by every cuGraphLaunch: nonzero sends it out of line */

/* ------------------------------------------------------------------ choosing a node's function */

/* The function a node of `ki` runs for a variant `fn`: a context-free kernel's variant is a
 * library's CUkernel, which a node takes as the function of the current context. */
static CUfunction node_function(kinfo *ki, CUfunction fn) {
  if (!ki->ctx_free) return fn;
  CUfunction f = NULL;
  return real_cuKernelGetFunction && real_cuKernelGetFunction(&f, (CUkernel)fn) == CUDA_SUCCESS ? f : NULL;
}

/* CUkernels of recorded kernels (cuLibraryGetKernel): a node may hold the function one of them
 * has in a context, which no launch passed. */
static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;
static CUkernel *lib_kernels;
static size_t nlib, caplib;
/* Functions found to be none of them since the last CUkernel was added: a graph of other
 * kernels (a library's, nvcc's) is not searched again at each instantiation or update. */
#define NOT_OURS 256
static struct {
  const void *func;
  size_t nlib;
} not_ours[NOT_OURS];

void graph_library_kernel(CUkernel k) {
  pthread_mutex_lock(&lib_lock);
  if (nlib == caplib) {
    size_t cap = caplib ? 2 * caplib : 64;
    CUkernel *grown = realloc(lib_kernels, cap * sizeof *grown);
    if (grown) {
      lib_kernels = grown;
      caplib = cap;
    }
  }
  if (nlib < caplib) lib_kernels[nlib++] = k;
  pthread_mutex_unlock(&lib_lock);
}

/* The kernel a node runs: it holds a CUfunction or a CUkernel, whichever the runtime gave the
 * driver, and a captured launch's node may hold the function of the CUkernel the launch passed.
 * Such a function, found once, is remembered as a handle of its kernel. */
static kinfo *node_kernel(const knode *p) {
  kinfo *ki = p->kern ? handle_lookup(p->kern) : NULL;
  if (ki || !p->func) return ki;
  if ((ki = handle_lookup(p->func)) || !real_cuKernelGetFunction) return ki;
  uint32_t slot = (uint32_t)mix64((uint64_t)(uintptr_t)p->func) & (NOT_OURS - 1);
  pthread_mutex_lock(&lib_lock);
  if (not_ours[slot].func == p->func && not_ours[slot].nlib == nlib) {
    pthread_mutex_unlock(&lib_lock);
    return NULL;
  }
  for (size_t i = 0; i < nlib && !ki; i++) {
    CUfunction f = NULL;
    if (real_cuKernelGetFunction(&f, lib_kernels[i]) == CUDA_SUCCESS && f == p->func && (ki = handle_lookup(lib_kernels[i]))) {
      pthread_mutex_lock(&reg_lock);
      handle_insert(p->func, ki, handle_owner(lib_kernels[i]));
      pthread_mutex_unlock(&reg_lock);
    }
  }
  if (!ki) {
    not_ours[slot].func = p->func;
    not_ours[slot].nlib = nlib;
  }
  pthread_mutex_unlock(&lib_lock);
  return ki;
}

static void trace_node(const knode *p, const kinfo *ki, const char *what) {
  if (g_trace_launch)
    fprintf(stderr, "proteus: graph node %s grid %u,%u,%u block %u,%u,%u: %s\n", ki ? ki->name : "(kernel not recorded)", p->gx,
            p->gy, p->gz, p->bx, p->by, p->bz, what);
}

/* An entry's variant for a graph node: its published function, or one held for its check
 * (PROTEUS_VALIDATE, check.c). A graph's launches are not checked (a check repeats a stream
 * launch), so a node runs a held variant unchecked, as without the check; a kernel launched on
 * streams too gets its variant checked there. */
static CUfunction node_variant(sentry *e) {
  CUfunction fn = atomic_load_explicit(&e->fn, memory_order_acquire);
  vcheck *c = fn ? NULL : atomic_load_explicit(&e->check, memory_order_acquire);
  return fn ? fn : c ? c->fn : NULL;
}

/* The variant for a node's parameters: 1 with *out pointed at it; 0 to leave the node as it
 * is, with *wait set where that variant is compiling. */
static int choose(const knode *in, knode *out, kinfo **kio, sentry **wait) {
  *wait = NULL;
  *kio = NULL;
  read_env();
  if (g_disable || g_validate == VALIDATE_FULL || in->extra) return 0;
  kinfo *ki = node_kernel(in);
  const void *h = in->kern && handle_lookup(in->kern) ? (const void *)in->kern : (const void *)in->func;
  *kio = ki;
  if (!ki || atomic_load(&ki->state) == K_DISABLED) {
    trace_node(in, ki, "the original");
    return 0;
  }
  CUcontext ctx = in->func ? NULL : in->ctx;
  if (!ctx && (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) return 0;
  dim3 grid = {in->gx, in->gy, in->gz}, block = {in->bx, in->by, in->bz};
  CUfunction fn = NULL;
  sentry *e = NULL;
  if (atomic_load(&ki->state) == K_ACTIVE && (in->params || !ki->nparams)) {
    uint8_t key[MAX_KEY];
    int len = stable_key(ki, in->params, grid, block, key);
    if (len == -1) return 0;
    if (len >= 0 && (e = find_variant(ki, ki->ctx_free ? NULL : ctx, key, len))) {
      if (!(fn = node_variant(e))) {
        if (atomic_load_explicit(&e->pending, memory_order_acquire)) *wait = e;
        trace_node(in, ki, *wait ? "the original while its variant compiles" : "the original");
        return 0;
      }
    }
  }
  if (!e) {
    sentry *served, *compiling;
    int asked;
    if (!gpu_claim(&cuda_ops)) return 0;   /* the process is HIP's (platform.h) */
    if (!(fn = miss_variant(h, in->params, grid, block, ki, ctx, &served, &compiling, &asked))) {
      *wait = compiling;
      trace_node(in, ki, compiling ? "the original while its variant compiles" : "the original");
      return 0;
    }
  }
  CUfunction f = node_function(ki, fn);
  trace_node(in, ki, f ? "a variant" : "the original");
  if (!f) return 0;
  *out = *in;
  out->func = f;
  out->kern = NULL;
  return 1;
}

/* ------------------------------------------------------------------ nodes waiting */

static void *template_of(void *exec) {   /* graph_lock held */
  for (exec_rec *x = execs; x; x = x->next)
    if (x->exec == exec) return x->graph;
  return NULL;
}

static void wait_for(void *exec, void *graph, void *node, kinfo *ki, sentry *e, const knode *p) {
  if (!graph || atomic_load(&ki->state) != K_ACTIVE) return;
  /* each copy at a 16-byte boundary, as the app's own arguments are (a float4, a double2):
   * whoever reads them through argv may read them as their type */
  size_t bytes = 16;
  for (uint32_t i = 0; i < ki->nparams; i++) bytes += (ki->sizes[i] + 15) & ~(size_t)15;
  waiting *w = malloc(sizeof *w + ki->nparams * sizeof(void *) + bytes);
  if (!w) return;
  w->exec = exec;
  w->graph = graph;
  w->node = node;
  w->ki = ki;
  w->e = e;
  w->p = *p;
  w->p.params = w->argv;
  uint8_t *at = (uint8_t *)(((uintptr_t)(w->argv + ki->nparams) + 15) & ~(uintptr_t)15);
  for (uint32_t i = 0; i < ki->nparams; i++) {
    memcpy(at, p->params[i], ki->sizes[i]);
    w->argv[i] = at;
    at += (ki->sizes[i] + 15) & ~(size_t)15;
  }
  pthread_mutex_lock(&graph_lock);
  w->next = waits;
  waits = w;
  atomic_fetch_add(&nwaiting, 1);
  pthread_mutex_unlock(&graph_lock);
}

/* A template whose destruction waited for its nodes: destroyed once none waits. graph_lock held. */
static void destroy_if_doomed(void *graph) {
  for (waiting *w = waits; w; w = w->next)
    if (w->graph == graph) return;
  for (doomed **d = &dooms; *d; d = &(*d)->next)
    if ((*d)->graph == graph) {
      doomed *gone = *d;
      *d = gone->next;
      free(gone);
      for (exec_rec *x = execs; x; x = x->next)
        if (x->graph == graph) x->graph = NULL;   /* its nodes can no longer be named */
      real_cuGraphDestroy(graph);
      return;
    }
}

/* Drop the waiting nodes `match` selects. graph_lock held. */
static void drop_where(int (*match)(const waiting *, const void *, const void *), const void *a, const void *b) {
  for (waiting **p = &waits; *p;) {
    waiting *w = *p;
    if (!match(w, a, b)) {
      p = &w->next;
      continue;
    }
    *p = w->next;
    atomic_fetch_sub(&nwaiting, 1);
    void *graph = w->graph;
    free(w);
    destroy_if_doomed(graph);
  }
}
static int of_node(const waiting *w, const void *exec, const void *node) { return w->exec == exec && w->node == node; }
static int of_exec(const waiting *w, const void *exec, const void *unused) {
  (void)unused;
  return w->exec == exec;
}
static int any_of_node(const waiting *w, const void *node, const void *unused) {
  (void)unused;
  return w->node == node;
}
static int of_graph(const waiting *w, const void *graph, const void *unused) {
  (void)unused;
  return w->graph == graph;
}

/* At a launch of `exec`: each of its nodes whose variant landed runs it from now on. One whose
 * compilation failed or went stale (a policy change made the kernel's launches ask for another
 * key) keeps the original until the app sets its parameters again: asking for the new key here
 * would call the run time with graph_lock held, which a Python app's thread holding the GIL
 * may be waiting for. */
static void land(void *exec) {
  pthread_mutex_lock(&graph_lock);
  for (waiting **p = &waits; *p;) {
    waiting *w = *p;
    if (w->exec != exec || atomic_load_explicit(&w->e->pending, memory_order_acquire)) {
      p = &w->next;
      continue;
    }
    CUfunction fn = node_variant(w->e), f = fn ? node_function(w->ki, fn) : NULL;
    if (f) {
      knode out = w->p;
      out.func = f;
      out.kern = NULL;
      if (real_cuGraphExecKernelNodeSetParams_v2(exec, w->node, &out) == CUDA_SUCCESS) atomic_fetch_add(&w->ki->graph_nodes, 1);
    }
    *p = w->next;
    atomic_fetch_sub(&nwaiting, 1);
    void *graph = w->graph;
    free(w);
    destroy_if_doomed(graph);
  }
  pthread_mutex_unlock(&graph_lock);
}

/* ------------------------------------------------------------------ instantiation */

static int device_updatable(void *node) {
  long long value[8] = {0};   /* CUlaunchAttributeValue: 64 bytes; deviceUpdatable comes first */
  return real_cuGraphKernelNodeGetAttribute &&
         real_cuGraphKernelNodeGetAttribute(node, ATTR_DEVICE_UPDATABLE, value) == CUDA_SUCCESS && *(int *)value != 0;
}

/* Each kernel node of `graph` (the exec's template, or its copy for an update) gets its
 * variant: set on the exec (`exec`: instantiation) or on the copy (`copy`: an update). */
static void point_nodes(void *graph, void *exec, int for_update) {
  size_t n = 0;
  if (!real_cuGraphGetNodes || !real_cuGraphNodeGetType || !real_cuGraphKernelNodeGetParams_v2 ||
      !real_cuGraphExecKernelNodeSetParams_v2 || !real_cuGraphKernelNodeSetParams_v2 ||
      real_cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS || !n)
    return;
  void **nodes = malloc(n * sizeof *nodes);
  if (!nodes || real_cuGraphGetNodes(graph, nodes, &n) != CUDA_SUCCESS) {
    free(nodes);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    int type = -1;
    knode in, out;
    kinfo *ki = NULL;
    sentry *wait = NULL;
    if (real_cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS || type != NODE_KERNEL ||
        real_cuGraphKernelNodeGetParams_v2(nodes[i], &in) != CUDA_SUCCESS || device_updatable(nodes[i]))
      continue;
    if (choose(&in, &out, &ki, &wait)) {
      CUresult r = for_update ? real_cuGraphKernelNodeSetParams_v2(nodes[i], &out)
                              : real_cuGraphExecKernelNodeSetParams_v2(exec, nodes[i], &out);
      if (r == CUDA_SUCCESS) atomic_fetch_add(&ki->graph_nodes, 1);
    } else if (wait && !for_update) {
      wait_for(exec, graph, nodes[i], ki, wait, &in);
    }
  }
  free(nodes);
}

static void instantiated(CUresult r, void **exec, void *graph, unsigned long long flags) {
  if (g_trace_launch)
    fprintf(stderr, "proteus: graph %p instantiated (%d) as %p\n", graph, r, exec && r == CUDA_SUCCESS ? *exec : NULL);
  if (r != CUDA_SUCCESS || !exec || !*exec || (flags & INSTANTIATE_DEVICE_LAUNCH)) return;
  exec_rec *x = malloc(sizeof *x);
  if (x) {
    x->exec = *exec;
    x->graph = graph;
    pthread_mutex_lock(&graph_lock);
    x->next = execs;
    execs = x;
    pthread_mutex_unlock(&graph_lock);
  }
  point_nodes(graph, *exec, 0);
}

CUresult w_cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  CUresult r = real_cuGraphInstantiateWithFlags(exec, graph, flags);
  instantiated(r, exec, graph, flags);
  return r;
}
CUresult w_cuGraphInstantiate_v2(void **exec, void *graph, void **err_node, char *log, size_t size) {
  CUresult r = real_cuGraphInstantiate_v2(exec, graph, err_node, log, size);
  instantiated(r, exec, graph, 0);
  return r;
}
static CUresult instantiate_params_with(CUresult (*real)(void **, void *, void *), void **exec, void *graph, void *p) {
  CUresult r = real(exec, graph, p);
  instantiated(r, exec, graph, p ? ((instantiate_params *)p)->flags : 0);
  return r;
}
CUresult w_cuGraphInstantiateWithParams(void **exec, void *graph, void *p) {
  return instantiate_params_with(real_cuGraphInstantiateWithParams, exec, graph, p);
}
CUresult w_cuGraphInstantiateWithParams_ptsz(void **exec, void *graph, void *p) {
  return instantiate_params_with(real_cuGraphInstantiateWithParams_ptsz, exec, graph, p);
}

/* ------------------------------------------------------------------ updates */

/* The app sets a node's parameters: the variant for them, or what it passed (the original). */
static CUresult set_kernel(void *exec, void *node, const knode *p, CUresult (*set)(void *, void *, const knode *)) {
  pthread_mutex_lock(&graph_lock);
  drop_where(of_node, exec, node);   /* whatever it waited for had the old arguments */
  void *graph = template_of(exec);
  pthread_mutex_unlock(&graph_lock);
  knode out;
  kinfo *ki = NULL;
  sentry *wait = NULL;
  if (p && !device_updatable(node) && choose(p, &out, &ki, &wait) && set(exec, node, &out) == CUDA_SUCCESS) {
    atomic_fetch_add(&ki->graph_nodes, 1);
    return CUDA_SUCCESS;
  }
  CUresult r = set(exec, node, p);
  if (r == CUDA_SUCCESS && wait) wait_for(exec, graph, node, ki, wait, p);
  return r;
}
CUresult w_cuGraphExecKernelNodeSetParams_v2(void *exec, void *node, const knode *p) {
  return set_kernel(exec, node, p, real_cuGraphExecKernelNodeSetParams_v2);
}
/* CUDA 11's layout (no kern, ctx): passed on; the node runs what it is given. */
CUresult w_cuGraphExecKernelNodeSetParams(void *exec, void *node, const void *p) {
  pthread_mutex_lock(&graph_lock);
  drop_where(of_node, exec, node);
  pthread_mutex_unlock(&graph_lock);
  return real_cuGraphExecKernelNodeSetParams(exec, node, p);
}
static CUresult set_via_generic(void *exec, void *node, const knode *p) {
  node_params np;
  memset(&np, 0, sizeof np);
  np.type = NODE_KERNEL;
  np.kernel = *p;
  return real_cuGraphExecNodeSetParams(exec, node, &np);
}
CUresult w_cuGraphExecNodeSetParams(void *exec, void *node, void *p) {
  node_params *np = p;
  if (np && np->type == NODE_KERNEL) return set_kernel(exec, node, &np->kernel, set_via_generic);
  pthread_mutex_lock(&graph_lock);
  drop_where(of_node, exec, node);
  pthread_mutex_unlock(&graph_lock);
  return real_cuGraphExecNodeSetParams(exec, node, p);
}

/* The exec takes every node's parameters from `graph`: from a copy of it whose kernel nodes
 * run their variants, where one can be made (a graph with memory nodes cannot be copied). */
static void *pointed_copy(void *graph) {
  void *copy = NULL;
  read_env();
  if (g_disable || g_validate == VALIDATE_FULL || !real_cuGraphClone || real_cuGraphClone(&copy, graph) != CUDA_SUCCESS)
    return NULL;
  point_nodes(copy, NULL, 1);
  return copy;
}
CUresult w_cuGraphExecUpdate_v2(void *exec, void *graph, void *result) {
  pthread_mutex_lock(&graph_lock);
  drop_where(of_exec, exec, NULL);
  pthread_mutex_unlock(&graph_lock);
  void *copy = pointed_copy(graph);
  if (copy) {
    CUresult r = real_cuGraphExecUpdate_v2(exec, copy, result);
    real_cuGraphDestroy(copy);
    if (r == CUDA_SUCCESS) return r;   /* else the app's own graph answers, as it would have */
  }
  return real_cuGraphExecUpdate_v2(exec, graph, result);
}
CUresult w_cuGraphExecUpdate(void *exec, void *graph, void **err_node, int *result) {   /* CUDA 11's: passed on */
  pthread_mutex_lock(&graph_lock);
  drop_where(of_exec, exec, NULL);
  pthread_mutex_unlock(&graph_lock);
  return real_cuGraphExecUpdate(exec, graph, err_node, result);
}

/* ------------------------------------------------------------------ launches and lifetimes */

CUresult w_cuGraphLaunch(void *exec, CUstream s) {
  if (__builtin_expect(atomic_load_explicit(&nwaiting, memory_order_relaxed) != 0, 0)) land(exec);
  return real_cuGraphLaunch(exec, s);
}
CUresult w_cuGraphLaunch_ptsz(void *exec, CUstream s) {
  if (__builtin_expect(atomic_load_explicit(&nwaiting, memory_order_relaxed) != 0, 0)) land(exec);
  return real_cuGraphLaunch_ptsz(exec, s);
}

CUresult w_cuGraphExecDestroy(void *exec) {
  pthread_mutex_lock(&graph_lock);
  drop_where(of_exec, exec, NULL);
  for (exec_rec **x = &execs; *x; x = &(*x)->next)
    if ((*x)->exec == exec) {
      exec_rec *gone = *x;
      *x = gone->next;
      free(gone);
      break;
    }
  pthread_mutex_unlock(&graph_lock);
  return real_cuGraphExecDestroy(exec);
}

CUresult w_cuGraphDestroy(void *graph) {
  pthread_mutex_lock(&graph_lock);
  int held = 0;
  for (waiting *w = waits; w && !held; w = w->next) held = w->graph == graph;
  doomed *d = held ? malloc(sizeof *d) : NULL;
  if (d) {   /* destroyed when its last waiting node is done (destroy_if_doomed) */
    d->graph = graph;
    d->next = dooms;
    dooms = d;
    pthread_mutex_unlock(&graph_lock);
    return CUDA_SUCCESS;
  }
  if (held) drop_where(of_graph, graph, NULL);   /* no memory to put it off: its nodes stop waiting */
  for (exec_rec *x = execs; x; x = x->next)
    if (x->graph == graph) x->graph = NULL;
  pthread_mutex_unlock(&graph_lock);
  return real_cuGraphDestroy(graph);
}

CUresult w_cuGraphDestroyNode(void *node) {
  pthread_mutex_lock(&graph_lock);
  drop_where(any_of_node, node, NULL);
  pthread_mutex_unlock(&graph_lock);
  return real_cuGraphDestroyNode(node);
}

/* ------------------------------------------------------------------ where the wrappers come in */

/* An entry point the driver hands out (cuGetProcAddress, cuda.c's wrap_proc): ours where we
 * wrap it, else the real one. */
void *graph_proc(const char *sym, void *real, int ver, int ptsz) {
  if (ptsz) {
    WRAP_PROC("cuGraphLaunch", cuGraphLaunch_ptsz);
    WRAP_PROC("cuGraphInstantiateWithParams", cuGraphInstantiateWithParams_ptsz);
  } else {
    WRAP_PROC("cuGraphLaunch", cuGraphLaunch);
    WRAP_PROC("cuGraphInstantiateWithParams", cuGraphInstantiateWithParams);
  }
  if (ver >= 12000) {   /* the signatures CUDA 12 changed: the version asked for says which one */
    WRAP_PROC("cuGraphInstantiate", cuGraphInstantiateWithFlags);
    WRAP_PROC("cuGraphExecKernelNodeSetParams", cuGraphExecKernelNodeSetParams_v2);
    WRAP_PROC("cuGraphExecUpdate", cuGraphExecUpdate_v2);
  } else {
    WRAP_PROC("cuGraphInstantiate", cuGraphInstantiate_v2);
    WRAP_PROC("cuGraphExecKernelNodeSetParams", cuGraphExecKernelNodeSetParams);
    WRAP_PROC("cuGraphExecUpdate", cuGraphExecUpdate);
  }
  WRAP_PROC("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags);
  WRAP_PROC("cuGraphExecNodeSetParams", cuGraphExecNodeSetParams);
  WRAP_PROC("cuGraphExecDestroy", cuGraphExecDestroy);
  WRAP_PROC("cuGraphDestroy", cuGraphDestroy);
  WRAP_PROC("cuGraphDestroyNode", cuGraphDestroyNode);
  return real;
}

/* ------------------------------------------------------------------ apps linked against libcuda */

/* The names a program linked against CUDA 12's or 13's libcuda calls through its PLT (the
 * runtime asks cuGetProcAddress, and gets cuda.c's wrap_proc). */
#define GRAPH_EXPORT(name, params, args) \
  EXPORT CUresult name params { \
    init_driver_calls(); \
    if (!real_##name) *(void **)&real_##name = cuda_sym(#name); \
    return real_##name ? w_##name args : 999; \
  }
GRAPH_EXPORT(cuGraphInstantiateWithFlags, (void **e, void *g, unsigned long long f), (e, g, f))
GRAPH_EXPORT(cuGraphInstantiateWithParams, (void **e, void *g, void *p), (e, g, p))
GRAPH_EXPORT(cuGraphExecKernelNodeSetParams_v2, (void *e, void *n, const knode *p), (e, n, p))
GRAPH_EXPORT(cuGraphExecNodeSetParams, (void *e, void *n, void *p), (e, n, p))
GRAPH_EXPORT(cuGraphExecUpdate_v2, (void *e, void *g, void *r), (e, g, r))
GRAPH_EXPORT(cuGraphLaunch, (void *e, CUstream s), (e, s))
GRAPH_EXPORT(cuGraphExecDestroy, (void *e), (e))
GRAPH_EXPORT(cuGraphDestroy, (void *g), (g))
GRAPH_EXPORT(cuGraphDestroyNode, (void *n), (n))
#undef GRAPH_EXPORT
