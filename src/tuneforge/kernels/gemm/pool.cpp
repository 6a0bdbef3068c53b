// tuneforge's thread pool for the GEMM kernels: compiled once, after pool_api.h's declarations (template.py joins
// the two), into an object linked into every kernel's module, and once more as the library the process's modules
// share (the GEMM templates' process library: shared_run below), whose pool they all run on; the pool linked into a
// module is its fallback. Compiled into each kernel with its three call sites inlined, it was a third of every
// kernel's build (0.47-0.77 s of compiler a kernel unit without it, 0.73-1.13 s with it).
//
// Why not OpenMP: numpy's OpenBLAS keeps its worker threads spinning (sched_yield) for about 0.1 s after each
// call, and libgomp's workers spin for milliseconds after each parallel region and in every barrier. On a machine
// with as many cores as threads, a program alternating the two had each library's threads take the cores the
// other's were waiting for: a tuned call ran up to 100x slower in such a loop, and numpy's calls slowed as well.
// This pool is built so that neither side can stall the other:
//  - The calling thread works too, and the work is cut into chunks claimed one by one: a worker that is not
//    running (its core taken by another library's spinner) simply gets no chunk, and the call finishes on the
//    threads that are running, never slower than one thread doing everything. The caller only waits for chunks
//    a worker has actually begun.
//  - Idle workers spin a bounded time (SPIN_NS, yielding the core meanwhile), then sleep in the kernel (futex); one
//    whose yield gave the core away sleeps at once, so they never hold a core another library's thread needs.
//  - Workers are kept off the calling thread's CPU (within its allowed CPUs). After an idle spell, Linux wakes a
//    sleeper on the CPU of the thread that woke it (wake-affine), where it queued behind the caller for a time
//    slice: on a 2-vCPU VM, after 50 ms or more of idleness most 2-thread calls ran at one thread's speed.
// A user's OMP_WAIT_POLICY still decides: ACTIVE spins 40x longer (ACTIVE_SPIN_NS), PASSIVE sleeps at once.
//
// A call made for torch tensors runs on the process's OpenMP team instead (HostTeam, mode bit 16): torch's
// element-wise ops leave libgomp's workers spinning for milliseconds, and this pool's workers fighting them for
// the cores cost an MLP step at batch 512 on 2 cores 17% (57 ms against 49). On the same team as torch's ops, the
// threads that spin are the ones that take the chunks.
#include <atomic>
#include <new>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <dlfcn.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#pragma GCC visibility push(hidden)  // each module's own: never bound to another module's pool
namespace tfpool {

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

inline int64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// Sleeping on a 32-bit word until it changes: futex on Linux; elsewhere a short sleep loop.
inline void wait_while(std::atomic<uint32_t>* word, uint32_t value) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t*)word, FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
#else
    while (word->load(std::memory_order_acquire) == value) {
        timespec t{0, 50000};
        nanosleep(&t, nullptr);
    }
#endif
}

inline void wake_all(std::atomic<uint32_t>* word) {
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t*)word, FUTEX_WAKE_PRIVATE, 0x7fffffff, nullptr, nullptr, 0);
#else
    (void)word;
#endif
}

// Idle workers spin this long after a job (yielding the core every 64 pauses), then sleep. A worker asleep takes
// 20-60 us to wake on a 2-vCPU VM: with 50 us of spin, a program that does 0.1-1 ms of other work between calls
// (numpy's element-wise ops on the result) woke it on every call, 17x2048x64 fp64 then taking 79-123 us a call
// against 57-66 us with the workers spinning through the gap (OpenBLAS's own spin after a call: 0.1 s).
const int64_t SPIN_NS = 5000000, ACTIVE_SPIN_NS = 200000000;
// ... but a worker sleeps at once when a yield gave its core away: another thread needs that core, typically an
// OpenBLAS worker of a numpy call made meanwhile, which must not share it with a spinner. Given away, the core comes
// back after the other thread's time slice (milliseconds); the host's own interruptions (a yield of 20-100 us every
// few ms on this 2-vCPU VM) ended a 20 us threshold's spins after 5-7 ms whatever their length.
const int64_t YIELDED_NS = 200000;

enum { MAX_WORKERS = 255 };
const uint32_t ALL_CLAIMED = 0xffffffffu;  // a finished job's chunk count in `state`: above any job's chunks

struct Pool {
    // The job: `state` packs its generation (high 32 bits) and its next unclaimed chunk (low 32), so a worker
    // that wakes late cannot claim a chunk of a finished job; body/ctx/chunks stay valid while it holds one.
    std::atomic<uint64_t> state{0};
    std::atomic<uint32_t> generation{0};  // the futex word idle workers sleep on
    std::atomic<int64_t> done{0};        // chunks of the current job finished
    std::atomic<int> sleepers{0};
    std::atomic<int64_t> asleep_since{0};  // when the last worker went to sleep (now_ns)
    std::atomic<int> team{1};            // threads the current job may use (workers 1..team-1 join)
    std::atomic<bool> busy{false};       // one job at a time; another caller meanwhile runs its job alone
    Body body = nullptr;
    void* ctx = nullptr;
    int64_t chunks = 0;
    int workers = 0;                     // started so far (only grows; guarded by busy)
    int64_t spin_ns = SPIN_NS;
    int avoided_cpu = -1;                // the caller's CPU the workers were last kept off (guarded by busy)
    pthread_t threads[MAX_WORKERS];
};

inline Pool& pool() {
    static Pool* p = new Pool();  // never destroyed: detached workers may still be asleep in it at exit
    return *p;
}

// Claims and runs chunks of generation `gen` until none is left; returns how many it ran.
inline int64_t work(Pool& p, uint32_t gen) {
    int64_t ran = 0;
    uint64_t s = p.state.load(std::memory_order_acquire);
    for (;;) {
        if ((uint32_t)(s >> 32) != gen || (int64_t)(uint32_t)s >= p.chunks) return ran;
        if (p.state.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
            p.body(p.ctx, (int64_t)(uint32_t)s);
            p.done.fetch_add(1, std::memory_order_acq_rel);
            ++ran;
            s = p.state.load(std::memory_order_acquire);
        }
    }
}

inline void* worker_main(void* arg) {
    Pool& p = pool();
    const int index = (int)(intptr_t)arg;
    uint32_t seen = p.generation.load(std::memory_order_acquire);
    for (;;) {
        const int64_t start = now_ns();
        int spins = 0;
        uint32_t g;
        bool crowded = false;  // a yield gave the core away: another thread needs it
        while ((g = p.generation.load(std::memory_order_acquire)) == seen) {
            if (++spins % 64 == 0) {
                if (crowded || now_ns() - start > p.spin_ns) {
                    p.asleep_since.store(now_ns(), std::memory_order_relaxed);
                    p.sleepers.fetch_add(1, std::memory_order_seq_cst);
                    if (p.generation.load(std::memory_order_seq_cst) == seen) wait_while(&p.generation, seen);
                    p.sleepers.fetch_sub(1, std::memory_order_seq_cst);
                    crowded = false;
                } else {
                    const int64_t before = now_ns();
                    sched_yield();  // give the core to a thread that has work (another library's) while spinning
                    crowded = now_ns() - before > YIELDED_NS;
                }
            } else {
                relax();
            }
        }
        seen = g;
        if (index < p.team.load(std::memory_order_acquire)) work(p, g);
    }
    return nullptr;
}

inline void after_fork_in_child() {
    // The workers did not survive the fork: start afresh (the old Pool is leaked, its threads gone).
    const int64_t spin = pool().spin_ns;
    new (&pool()) Pool();
    pool().spin_ns = spin;
}

inline int64_t spin_setting() {
    const char* policy = getenv("OMP_WAIT_POLICY");
    if (policy && strcasecmp(policy, "passive") == 0) return 0;
    if (policy && strcasecmp(policy, "active") == 0) return ACTIVE_SPIN_NS;
    return SPIN_NS;
}

inline bool start_workers(Pool& p, int wanted) {
    static bool registered = false;
    if (!registered) {
        registered = true;
        p.spin_ns = spin_setting();
        pthread_atfork(nullptr, nullptr, after_fork_in_child);
    }
    while (p.workers < wanted && p.workers < MAX_WORKERS) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&t, &attr, worker_main, (void*)(intptr_t)(p.workers + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
#if defined(__linux__)
        pthread_setname_np(t, "tuneforge-pool");  // how top and /proc tell them from OpenBLAS's threads
#endif
        p.threads[p.workers++] = t;
        p.avoided_cpu = -1;  // the new worker may run anywhere yet
    }
    return p.workers > 0;
}

// Lets the workers run on every CPU the caller may use but the one it is on (nothing changes when that leaves none,
// e.g. a process pinned to one core, or when the caller has not moved since the last call).
inline void keep_off_caller_cpu(Pool& p) {
#if defined(__linux__)
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu == p.avoided_cpu) return;
    p.avoided_cpu = cpu;
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || !CPU_ISSET(cpu, &allowed) || CPU_COUNT(&allowed) < 2)
        return;
    CPU_CLR(cpu, &allowed);
    for (int w = 0; w < p.workers; ++w) pthread_setaffinity_np(p.threads[w], sizeof allowed, &allowed);
#else
    (void)p;
#endif
}

// The OpenMP runtime already loaded in the process (torch's libgomp), if any: GOMP_parallel(fn, data, threads,
// flags) runs fn(data) on a team of `threads`, the caller included, and returns when all have finished.
typedef void (*GompParallel)(void (*)(void*), void*, unsigned, unsigned);

inline GompParallel host_parallel() {
    static std::atomic<GompParallel> found{nullptr};
    GompParallel fn = found.load(std::memory_order_acquire);
    if (!fn) {  // looked up until a runtime is there (torch may be imported after the first call)
        fn = (GompParallel)dlsym(RTLD_DEFAULT, "GOMP_parallel");
        found.store(fn, std::memory_order_release);
    }
    return fn;
}

thread_local bool host_team = false;  // this thread's current call runs on the OpenMP team (HostTeam)

HostTeam::HostTeam(bool on) : saved(host_team) { host_team = on; }
HostTeam::~HostTeam() { host_team = saved; }

struct HostJob {
    Body body;
    void* ctx;
    int64_t chunks;
    std::atomic<int64_t> next{0};
};

inline void host_work(void* data) {
    HostJob& job = *(HostJob*)data;
    for (int64_t c; (c = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) job.body(job.ctx, c);
}

inline int64_t pool_asleep_ns() {
    Pool& p = pool();
    if (p.sleepers.load(std::memory_order_relaxed) == 0) return 0;
    return now_ns() - p.asleep_since.load(std::memory_order_relaxed);
}

inline void pool_run(int64_t threads, int64_t chunks, Body body, void* ctx) {
    Pool& p = pool();
    bool expected = false;
    if (threads <= 1 || chunks <= 1 || chunks >= (int64_t)ALL_CLAIMED ||
        !p.busy.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
        for (int64_t c = 0; c < chunks; ++c) body(ctx, c);
        return;
    }
    if (!start_workers(p, (int)(threads - 1))) {
        p.busy.store(false, std::memory_order_release);
        for (int64_t c = 0; c < chunks; ++c) body(ctx, c);
        return;
    }
    keep_off_caller_cpu(p);
    const uint32_t gen = (uint32_t)(p.state.load(std::memory_order_relaxed) >> 32) + 1;
    p.body = body;
    p.ctx = ctx;
    p.chunks = chunks;
    p.done.store(0, std::memory_order_relaxed);
    p.team.store((int)threads, std::memory_order_relaxed);
    p.state.store((uint64_t)gen << 32, std::memory_order_release);
    p.generation.store(gen, std::memory_order_seq_cst);
    if (p.sleepers.load(std::memory_order_seq_cst) > 0) wake_all(&p.generation);
    work(p, gen);
    // Only chunks a worker has claimed are left: it is running them, so wait briefly, then yield to it.
    int spins = 0;
    while (p.done.load(std::memory_order_acquire) < chunks) {
        if (++spins > 200) sched_yield(); else relax();
    }
    // Every chunk is claimed (the state's count is `chunks`): mark the job so before the next caller writes its
    // own chunk count. A worker still holding this generation's state would otherwise compare `chunks` with the
    // next job's larger count, claim a chunk "of this job", and run the next job's body on it, counted in the next
    // job's `done`: a chunk run twice and a call returning before its last chunk ended (wrong GEMM results seen
    // with six Python threads calling kernels at once).
    p.state.store(((uint64_t)gen << 32) | ALL_CLAIMED, std::memory_order_release);
    p.busy.store(false, std::memory_order_release);
}

#if defined(TUNEFORGE_POOL_LIBRARY)
inline void shared_run(int64_t threads, int64_t chunks, Body body, void* ctx) { pool_run(threads, chunks, body, ctx); }
inline int64_t shared_asleep_ns() { return pool_asleep_ns(); }
#else
// The process's one pool (this source built as the GEMM templates' process library, loaded with its symbols global
// before any kernel module): a worker of a module's own pool, spinning after that module's call, took a core from
// the next module's call (several tuned shapes in one program, or the candidates of one tuning timed in turn), and
// each module started threads of its own. A module loaded where the library is not uses the pool linked into it.
typedef void (*RunFn)(int64_t, int64_t, Body, void*);
typedef int64_t (*AsleepFn)();

struct Shared {
    RunFn run = nullptr;
    AsleepFn asleep_ns = nullptr;
    Shared() {
        RunFn r = (RunFn)dlsym(RTLD_DEFAULT, "tuneforge_pool_run_v1");
        AsleepFn a = (AsleepFn)dlsym(RTLD_DEFAULT, "tuneforge_pool_asleep_ns_v1");
        if (r && a) run = r, asleep_ns = a;
    }
};

inline const Shared& shared() {
    static const Shared found;  // looked up at the module's first parallel call
    return found;
}

inline void shared_run(int64_t threads, int64_t chunks, Body body, void* ctx) {
    if (RunFn f = shared().run) f(threads, chunks, body, ctx); else pool_run(threads, chunks, body, ctx);
}

inline int64_t shared_asleep_ns() {
    AsleepFn f = shared().asleep_ns;
    return f ? f() : pool_asleep_ns();
}
#endif

int64_t asleep_ns() { return shared_asleep_ns(); }

void run(int64_t threads, int64_t chunks, Body body, void* ctx) {
    if (host_team && threads > 1 && chunks > 1) {
        if (GompParallel parallel = host_parallel()) {
            HostJob job{body, ctx, chunks};
            parallel(host_work, &job, (unsigned)(threads < chunks ? threads : chunks), 0);
            return;
        }
    }
    shared_run(threads, chunks, body, ctx);
}

}  // namespace tfpool
#pragma GCC visibility pop

#if defined(TUNEFORGE_POOL_LIBRARY)
// The library's entry points, found by name (dlsym) by every kernel module: plain C, versioned, so that a module
// built against another version of this file still calls a pool that does what it expects.
extern "C" __attribute__((visibility("default"))) void tuneforge_pool_run_v1(int64_t threads, int64_t chunks,
                                                                             tfpool::Body body, void* ctx) {
    tfpool::pool_run(threads, chunks, body, ctx);
}

extern "C" __attribute__((visibility("default"))) int64_t tuneforge_pool_asleep_ns_v1() {
    return tfpool::pool_asleep_ns();
}
#endif
