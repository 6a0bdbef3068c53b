// tuneforge's thread pool for the GEMM kernels, as a kernel calls it (pasted into each kernel's source by
// template.py). The pool itself (pool.cpp: why a pool of its own and not OpenMP) is compiled once and linked into
// every kernel's module, which runs on the process's one pool where that is loaded.
#include <stdint.h>

#pragma GCC visibility push(hidden)  // each module's own: never bound to another module's pool
namespace tfpool {

typedef void (*Body)(void* ctx, int64_t chunk);

// Runs body(ctx, c) for every c in [0, chunks) on up to `threads` threads, this one included; returns when all
// have finished. Chunks may run in any order and on any of the threads.
void run(int64_t threads, int64_t chunks, Body body, void* ctx);

// How long a worker of the pool has been asleep (0 while all spin or none was started): after milliseconds, waking
// one took 20-60 us on a 2-vCPU VM (its virtual CPU idle), after 0.1 ms 5 us.
const int64_t LONG_ASLEEP_NS = 500000;  // from here waking took over 10 us
int64_t asleep_ns();

// Set for the length of one kernel call: its parallel parts run on the process's OpenMP team (torch's), when one is
// loaded, instead of the pool.
struct HostTeam {
    bool saved;
    explicit HostTeam(bool on);
    ~HostTeam();
};

}  // namespace tfpool
#pragma GCC visibility pop
