"""C++ text of the small thread pool the small-batch linears (``kernels.cpu_small_linear``)
and the one-call decoder stack (``kernels.cpu_decode_layers``) run on.

Why a pool of our own: a decode step is ~120 linears a few tens of microseconds apart. Under
``OMP_WAIT_POLICY=PASSIVE`` each OpenMP region paid for waking a sleeping thread; spinning
OpenMP threads took a busy neighbour's core. These workers spin for ``SPIN_US`` after a task,
so the next linear of the same step finds them awake, then sleep on a futex between steps.

Contract (C++):
- ``run(n, fn, ctx, spin)``: ``fn(ctx)`` on the caller and ``n - 1`` workers; returns when all
  are done (``fn`` claims its work as it goes). One caller owns the pool at a time; a second
  thread calling meanwhile runs ``fn`` alone. ``spin``: whether the workers spin after it.
- ``threads_now()``: torch's thread count on the calling thread, read every call.
- ``pool_parallel_for(begin, end, grain, f)``: ``at::parallel_for``'s contract on this pool
  (``SerialLoops`` makes it run inline on this thread while alive).
``POOL`` must come after the includes and before any user; ``PARALLEL_FOR`` after ``POOL``.
Text only: ``kernels.cpu_small_linear`` assembles and compiles it.
"""

# How long a worker spins for the next task before sleeping: longer than the gap between two
# linears of one step (tens of us of Python and small ops), far shorter than a step.
SPIN_US = 300

POOL = r"""
// ---- the pool: workers spin SPIN_US after each task, then sleep on a futex ----------------
struct Pool {
  std::vector<std::thread> workers;
  std::atomic<uint32_t> gen{0};        // bumped once per task (the futex word)
  std::atomic<int> pending{0};         // workers still running the current task
  std::atomic<int> sleepers{0};
  std::atomic<bool> spin{true};        // whether workers spin after this task (see run)
  int n = 1;                           // threads a task uses, the caller included
  void (*fn)(void*) = nullptr;
  void* ctx = nullptr;
  pid_t pid = 0;
};
static Pool* g_pool = nullptr;

static void futex_wait(std::atomic<uint32_t>* w, uint32_t v) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT_PRIVATE, v, nullptr, nullptr, 0);
}
static void futex_wake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

static void worker_loop(Pool* p, int index) {
  uint32_t seen = 0;  // the generation at creation: a task posted before this thread ran counts
  bool sleep_now = false;  // the last task said not to spin
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    int spins = 0;
    while (p->gen.load(std::memory_order_acquire) == seen) {
      CP_PAUSE();
      if (!sleep_now) {
        if (++spins < 256) continue;
        spins = 0;
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::steady_clock::now() - t0).count();
        if (us < CP_SPIN_US) {
          std::this_thread::yield();  // a neighbour waiting for this core gets it
          continue;
        }
      }
      p->sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (p->gen.load(std::memory_order_seq_cst) == seen) futex_wait(&p->gen, seen);
      p->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      t0 = std::chrono::steady_clock::now();
    }
    seen = p->gen.load(std::memory_order_acquire);
    if (index < p->n) p->fn(p->ctx);
    sleep_now = !p->spin.load(std::memory_order_relaxed);  // read before releasing the caller
    p->pending.fetch_sub(1, std::memory_order_acq_rel);
  }
}

static Pool* pool_for(int n) {
  // a forked child inherits the memory but not the threads: start a fresh pool there
  if (g_pool != nullptr && g_pool->pid == getpid() &&
      static_cast<int>(g_pool->workers.size()) + 1 >= n) return g_pool;
  Pool* p = new Pool();  // an outgrown pool is left running idle (asleep): rare, tiny
  p->pid = getpid();
  for (int i = 1; i < n; ++i) p->workers.emplace_back(worker_loop, p, i);
  for (auto& t : p->workers) t.detach();
  g_pool = p;
  return p;
}

static std::atomic<bool> g_busy{false};

// Run fn(ctx) on the caller and n - 1 workers; returns when all are done (fn claims its work
// as it goes, so any number of runners finishes it). One caller at a time owns the pool; a
// second thread calling meanwhile (two engines in one process) runs fn alone instead of waiting.
static void run(int n, void (*fn)(void*), void* ctx, bool spin) {
  if (n <= 1 || g_busy.exchange(true, std::memory_order_acquire)) { fn(ctx); return; }
  struct Release { ~Release() { g_busy.store(false, std::memory_order_release); } } release;
  Pool* p = pool_for(n);
  p->fn = fn; p->ctx = ctx; p->n = n;
  p->spin.store(spin, std::memory_order_relaxed);
  p->pending.store(static_cast<int>(p->workers.size()), std::memory_order_relaxed);
  p->gen.fetch_add(1, std::memory_order_seq_cst);
  if (p->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&p->gen);
  fn(ctx);
  int spins = 0;
  while (p->pending.load(std::memory_order_acquire) > 0) {
    CP_PAUSE();
    if (++spins > 4096) { std::this_thread::yield(); spins = 0; }  // a worker lost its core
  }
}

// torch's count on the calling thread, read every call: the engine's adaptive threads
// (engine/runner/step_threads.py) change it between steps
static int threads_now() { return std::max(1, at::get_num_threads()); }
"""

PARALLEL_FOR = r"""
// ---- at::parallel_for's contract on this pool (kernels.cpu_decode_layers) ------------------
// f(begin, end) over chunks of [begin, end) of at least `grain`, inline when the range is one
// grain, one thread runs, or the calling thread asked for serial loops (SerialLoops). Chunks
// are claimed as in job_part; f must not care which thread runs a chunk (the layer ops' loops
// do not: each index is computed alike wherever it runs). An exception thrown by f, on any
// thread, stops the other chunks and is rethrown to the caller once every runner is done.
static thread_local bool t_serial = false;

// While alive, pool_parallel_for runs inline on this thread: the stack's final norm, after
// its last linear let the workers sleep, must not wake them (the LM head's pool follows).
struct SerialLoops {
  SerialLoops() { t_serial = true; }
  ~SerialLoops() { t_serial = false; }
};

template <class F>
struct ForJob {
  const F* f;
  int64_t end, chunk;
  std::atomic<int64_t> next;
  std::atomic<bool> failed{false};
  std::exception_ptr error;
};

template <class F>
static void for_part(void* ctx) {
  ForJob<F>& j = *static_cast<ForJob<F>*>(ctx);
  for (;;) {
    const int64_t b = j.next.fetch_add(j.chunk, std::memory_order_relaxed);
    if (b >= j.end) return;
    try {
      (*j.f)(b, std::min(b + j.chunk, j.end));
    } catch (...) {
      if (!j.failed.exchange(true)) j.error = std::current_exception();
      j.next.store(j.end, std::memory_order_relaxed);  // the others stop at their next claim
      return;
    }
  }
}

template <class F>
void pool_parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  const int n = threads_now();
  if (t_serial || n <= 1 || end - begin <= std::max<int64_t>(grain, 1)) {
    f(begin, end);
    return;
  }
  const int64_t chunk = std::max<int64_t>(std::max<int64_t>(grain, 1),
                                          (end - begin + 4 * n - 1) / (4 * n));
  ForJob<F> job{&f, end, chunk, {begin}};
  run(n, for_part<F>, &job, true);  // the stack's workers spin between its ops
  if (job.error) std::rethrow_exception(job.error);  // every runner is done with job here
}
"""
