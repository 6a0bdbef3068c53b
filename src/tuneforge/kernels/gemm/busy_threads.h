// How many of this process's other threads are running (pasted ahead of dispatch.cpp by dispatch.py).
//
// Why: a multi-threaded kernel whose helper has to share a core with a running thread takes 2-3x its best
// time (the helper is descheduled holding a chunk that the caller then waits for: 512^3 fp32 on 2 cores, 1.3 ->
// 2.8 ms, a GEMV 0.4 -> 0.9 ms). The usual such thread is an OpenBLAS worker, spinning for ~0.1 s after each
// numpy call, and numpy.matmul, whose threads those are, then runs at its full speed. tuneforge's own pool workers ("tuneforge-pool") and the
// calling thread are never counted.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <vector>

namespace tfbusy {

inline int64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

#if defined(__linux__)
struct Watched {
    pid_t tid;
    clockid_t clock;  // its CPU-time clock
    int64_t cpu_ns, seen_ns;  // its CPU time at the last look, and when that was
    int stat_fd;      // its /proc/self/task/<tid>/stat, opened when first needed (-1: not yet)
};

struct Census {
    pid_t pid = 0;  // the process the list was made in: a forked child must list its own threads
    int64_t listed_ns = 0;
    int cpus = 1;  // CPUs this process may run on
    std::vector<Watched> threads;
};

inline Census& census() {
    static Census* c = new Census();  // never destroyed: a late call at exit must still find it
    return *c;
}

const int64_t RELIST_NS = 1000000000;  // threads come and go rarely: list them again once a second

inline clockid_t thread_clock(pid_t tid) { return (clockid_t)(((~(unsigned)tid) << 3) | 6); }  // CPUCLOCK_SCHED, per thread

inline int64_t cpu_ns(clockid_t clock) {
    timespec t;
    return clock_gettime(clock, &t) == 0 ? (int64_t)t.tv_sec * 1000000000 + t.tv_nsec : -1;
}

inline bool is_pool_worker(pid_t tid) {
    char path[64], name[32] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const ssize_t n = read(fd, name, sizeof name - 1);
    close(fd);
    return n > 0 && strncmp(name, "tuneforge-pool", 14) == 0;
}

inline void relist(Census& c) {
    std::vector<Watched> before;
    if (c.pid == getpid()) before.swap(c.threads);  // a thread still there keeps its last look and its file
    else c.threads.clear();  // a forked child's copies of the parent's files: theirs to close, not ours to use
    c.pid = getpid();
    c.listed_ns = now_ns();
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    c.cpus = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 1;
    DIR* dir = opendir("/proc/self/task");
    if (dir == nullptr) return;
    while (dirent* entry = readdir(dir)) {
        const pid_t tid = (pid_t)atoi(entry->d_name);
        if (tid <= 0 || is_pool_worker(tid)) continue;
        Watched w{tid, thread_clock(tid), 0, 0, -1};
        for (Watched& old : before)
            if (old.tid == tid) std::swap(w, old);
        c.threads.push_back(w);
    }
    closedir(dir);
    for (const Watched& gone : before)
        if (gone.stat_fd >= 0) close(gone.stat_fd);
}

// Whether a thread is in state R (running, or ready and waiting for a CPU): the letter after the command name.
inline bool runnable(Watched& w) {
    if (w.stat_fd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)w.tid);
        w.stat_fd = open(path, O_RDONLY | O_CLOEXEC);
        if (w.stat_fd < 0) return false;
    }
    char buf[512];
    const ssize_t n = pread(w.stat_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return false;
    buf[n] = 0;
    const char* name_end = strrchr(buf, ')');  // the command name may hold anything, ')' included
    return name_end != nullptr && name_end[1] == ' ' && name_end[2] == 'R';
}

// Other threads of this process in state R (the caller excluded). Reading a thread's state from /proc costs ~3 us
// here, its CPU-time clock ~0.5 us: a thread whose clock has not moved since the previous look has been waiting
// all along and is not read. (Sampled CPU time alone will not do: a spinner sharing a core with the kernel's
// helper gets little of it, yet it is there, and costs the kernel its speed.) `share`, when given, is set to the
// largest share of a CPU that one of the running threads used since the previous look (0 to 1).
inline int running_others(double* share = nullptr) {
    Census& c = census();
    const int64_t now = now_ns();
    if (c.pid != getpid() || now - c.listed_ns > RELIST_NS) relist(c);
    const pid_t caller = (pid_t)syscall(SYS_gettid);
    int running = 0;
    if (share != nullptr) *share = 0;
    for (Watched& w : c.threads) {
        if (w.tid == caller) continue;
        const int64_t cpu = cpu_ns(w.clock);
        if (cpu < 0) {  // the thread has ended
            c.listed_ns = 0;
            continue;
        }
        if (cpu != w.cpu_ns && runnable(w)) {
            ++running;
            if (share != nullptr && w.seen_ns != 0 && now > w.seen_ns) {
                const double used = (double)(cpu - w.cpu_ns) / (double)(now - w.seen_ns);
                if (used > *share) *share = used < 1 ? used : 1;
            }
        }
        w.cpu_ns = cpu;
        w.seen_ns = now;
    }
    return running;
}

// CPUs this process may run on (as of the last listing of its threads).
inline int cpus() { return census().cpus; }
#else
inline int running_others(double* share = nullptr) {
    if (share != nullptr) *share = 0;
    return 0;
}
inline int cpus() { return 1; }
#endif

}  // namespace tfbusy
