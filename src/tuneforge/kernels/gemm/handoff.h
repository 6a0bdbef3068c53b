// The hand-off of a multi-threaded kernel's plain calls to numpy.matmul (pasted into dispatch.cpp by dispatch.py,
// after busy_threads.h). One Handoff per tuned layout holds what has been seen of its calls.
#include <stdint.h>
#include <stdlib.h>

namespace tfhandoff {

struct Handoff {
    int64_t best_ns;        // the kernel's quickest call with no other thread of the process running
    int64_t contended_ns;   // its typical call while one was (0: none seen yet)
    int64_t fewer_ns;       // ... made then on the threads left free (0: none seen yet)
    int64_t library_ns;     // numpy.matmul's typical call made in its place (0: none yet)
    int64_t defer_until_ns, window_ns;
    double library_ratio;   // numpy's tuned time over the kernel's (0: not known)
    int64_t crowded;        // crowded calls planned so far (EXPLORE_EVERY)
};

inline int64_t now_ns() { return tfbusy::now_ns(); }

// A multi-threaded kernel's plain calls (alpha 1, beta 0, no bias) go to numpy.matmul while the kernel's helpers
// would share cores with other running threads of this process and numpy would be the faster of the two then
// (busy_threads.h: such a thread is usually an OpenBLAS worker spinning after a numpy call, so numpy runs at full
// speed while the kernel takes 2-3x its time). A hand-off lasts a window, WINDOW_MIN at first.
// numpy's calls made here keep its workers spinning too, so when a window ends the kernel takes the calls again,
// and running workers are only evidence once library_echo_ns has passed since the last call numpy took here: the
// workers still running then are the program's own numpy work. The next window is 4x longer (at most WINDOW_MAX)
// while that work goes on, WINDOW_MIN again after a pause; workers seen idle end the hand-offs. So a one-off
// numpy call costs a window and an echo, and a program that interleaves numpy matmuls with the kernel's calls
// has numpy make them but for an echo every WINDOW_MAX.
const int64_t WINDOW_MIN = 100000000, WINDOW_MAX = 10000000000;
const double SPELL_SHARE = 0.5;      // busy for this share of the time since the previous look: the spell goes on
// Every EXPLORE_EVERY-th crowded call is made the next way in turn (numpy, the kernel beside the running threads,
// the kernel on the threads left free), whatever is expected of it. Without that a way once measured slow, or
// guessed slow from a tuning ratio taken in a noisy moment, was never tried again: seen here, a 128^3 fp32 kernel
// whose tuned ratio put numpy at 59 us kept its crowded calls at 44 us while numpy made them in 32-36. An explored
// way that is slower costs one call in EXPLORE_EVERY (1-2% where it is twice as slow).
const int64_t EXPLORE_EVERY = 64;
int64_t library_echo_ns = 0;         // how long OpenBLAS's workers spin after a call (start_echo, measure_echo)
int64_t library_end_ns = 0;          // when the last call handed to numpy ended
int64_t last_look_ns = 0;            // when plan last looked at the other threads

// OpenBLAS's workers spin 2^OPENBLAS_THREAD_TIMEOUT (4-30, default 28) time-stamp-counter ticks after a call. On
// x86 the counter's rate is measured between init and a look at least 50 ms later (the echo is then 1.1x its
// length: 2.5 GHz here, 0.12 s); until then, and elsewhere, it is counted at 1.5 GHz, a floor for the rate, so the
// echo is never under-estimated (0.18 s) and a longer one only delays giving the kernel its calls back.
int echo_exponent = 28;
int64_t init_ns = 0;
uint64_t init_ticks = 0;
bool echo_measured = false;

inline uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#else
    return 0;
#endif
}

inline void start_echo() {
    if (const char* text = getenv("OPENBLAS_THREAD_TIMEOUT")) {
        const int value = atoi(text);
        if (value > 0) echo_exponent = value < 4 ? 4 : value > 30 ? 30 : value;
    }
    library_echo_ns = (int64_t)((double)(1LL << echo_exponent) / 1.5);
    init_ns = now_ns();
    init_ticks = ticks();
}

inline void measure_echo(int64_t now) {
    if (echo_measured || init_ticks == 0 || now - init_ns < 50000000) return;
    const uint64_t elapsed = ticks() - init_ticks;
    const double per_ns = (double)elapsed / (double)(now - init_ns);
    echo_measured = true;
    if (per_ns > 0.5 && per_ns < 10)  // a plausible counter (0.5-10 GHz): else keep the floor
        library_echo_ns = (int64_t)(1.1 * (double)(1LL << echo_exponent) / per_ns);
}

inline int64_t typical(int64_t before, int64_t took) { return before == 0 ? took : (3 * before + took) / 4; }

// What a crowded call is expected to take made each way, from what has been seen of each; a way not tried yet is
// expected to take the kernel's best time, so that each is tried once (numpy's is guessed from its tuned ratio).
struct Expected {
    double contended, fewer, library;
};

inline Expected expected(const Handoff& e) {
    const double best = (double)e.best_ns;
    return {e.contended_ns ? (double)e.contended_ns : best, e.fewer_ns ? (double)e.fewer_ns : best,
            e.library_ns ? (double)e.library_ns : (e.library_ratio > 0 ? e.library_ratio : 1.0) * best};
}

enum Plan { QUIET, CONTENDED, FEWER, LIBRARY_TAKES };

// Who makes a call of a kernel tuned for `tuned` threads, and what its time will teach: unless numpy has a window,
// the kernel on all its threads when no other thread crowds them; else the fastest of the kernel beside the
// running threads, the kernel on the threads they leave free (`threads` is set; only if `may_use_fewer`: the
// result must not change), and numpy. Called with the GIL held, as is learn.
inline Plan plan(Handoff* e, int64_t tuned, bool may_use_fewer, int64_t now, int64_t* threads, bool* explored) {
    *explored = false;
    if (now < e->defer_until_ns) return LIBRARY_TAKES;
    measure_echo(now);
    double share;  // how busy the running threads were since the previous look
    const int64_t since_look = now - last_look_ns;
    last_look_ns = now;
    const int others = tfbusy::running_others(&share);
    const int64_t free_cpus = tfbusy::cpus() - others;
    if (others == 0 || free_cpus >= tuned) {
        e->window_ns = 0;
        return QUIET;
    }
    if (e->best_ns == 0) return CONTENDED;  // nothing to compare with yet
    const int64_t left_free = free_cpus > 1 ? free_cpus : 1;
    // numpy's calls made here keep its workers spinning: within an echo of the last, they are no evidence
    const bool echo = library_end_ns != 0 && now - library_end_ns < library_echo_ns;
    if (++e->crowded % EXPLORE_EVERY == 0) {
        const Plan ways[3] = {LIBRARY_TAKES, CONTENDED, FEWER};
        const Plan way = ways[(e->crowded / EXPLORE_EVERY - 1) % 3];
        // numpy not within an echo (its call would prolong the spin), and for one call only: no window
        if ((way != LIBRARY_TAKES || !echo) && (way != FEWER || may_use_fewer)) {
            *explored = true;
            *threads = way == FEWER ? left_free : tuned;
            return way;
        }
    }
    const Expected x = expected(*e);
    const bool fewer = may_use_fewer && x.fewer < x.contended;
    *threads = fewer ? left_free : tuned;
    const Plan kernel = fewer ? FEWER : CONTENDED;
    if (echo || (fewer ? x.fewer : x.contended) <= x.library) return kernel;
    // Looked at moments ago, or busy all along since: the same spell of numpy work goes on, give numpy a longer
    // window. Mostly idle for longer than an echo: a new spell, which may be a single call.
    const bool goes_on = e->window_ns != 0 && (since_look < library_echo_ns || share >= SPELL_SHARE);
    e->window_ns = goes_on ? (4 * e->window_ns < WINDOW_MAX ? 4 * e->window_ns : WINDOW_MAX) : WINDOW_MIN;
    e->defer_until_ns = now + e->window_ns;
    return LIBRARY_TAKES;
}

// Notes the time of a call made as `planned` (started at `start`, ended at `end`); an `explored` way's figure is
// old news by then, and the new time counts for half of it.
inline void learn(Handoff* e, Plan planned, bool explored, int64_t start, int64_t end) {
    const int64_t took = end - start;
    int64_t* figure = planned == CONTENDED ? &e->contended_ns : planned == FEWER ? &e->fewer_ns
                    : planned == LIBRARY_TAKES ? &e->library_ns : nullptr;
    if (figure == nullptr) {
        if (e->best_ns == 0 || took < e->best_ns) e->best_ns = took;
        return;
    }
    *figure = explored && *figure != 0 ? (*figure + took) / 2 : typical(*figure, took);
    if (planned == LIBRARY_TAKES) library_end_ns = end;
}

}  // namespace tfhandoff
