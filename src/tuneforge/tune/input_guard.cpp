// Which large inputs a choice wrote into, known without comparing them (input_guard.py): their whole pages are
// read-only while the choices run; the first write into one faults, and this handler marks the input written
// and makes its pages writable again, so the write goes through. Any other fault is handled as it would have
// been without this handler (by default, the process dies of it).
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

namespace {
constexpr int SLOTS = 64;
// Set between runs by the thread that arms them, read by the handler in whichever thread faults.
volatile uintptr_t lo[SLOTS];
volatile uintptr_t hi[SLOTS];
volatile sig_atomic_t written[SLOTS];
struct sigaction previous;

void on_fault(int sig, siginfo_t* info, void* context) {
    const uintptr_t at = (uintptr_t)info->si_addr;
    for (int i = 0; i < SLOTS; ++i) {
        const uintptr_t start = lo[i], end = hi[i];
        if (start < end && at >= start && at < end) {
            written[i] = 1;
            mprotect((void*)start, end - start, PROT_READ | PROT_WRITE);
            return;  // the faulting write runs again, allowed now
        }
    }
    // A handler that hands the fault back (as faulthandler does, once it has dumped the stack) would bring it
    // straight back here: the second time the same address faults, the default action ends the process.
    static volatile uintptr_t last_foreign = 0;
    static volatile sig_atomic_t foreign_before = 0;
    if (foreign_before && at == last_foreign) {
        signal(sig, SIG_DFL);
        return;
    }
    last_foreign = at;
    foreign_before = 1;
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {
        signal(sig, SIG_DFL);  // the faulting instruction runs again, and its fault takes the default action
    }
}
}  // namespace

// Put the handler in, or back in front of one a library loaded since installed; 0 or an errno.
extern "C" int tf_guard_install() {
    struct sigaction current;
    if (sigaction(SIGSEGV, nullptr, &current) != 0) return errno;
    if (!(current.sa_flags & SA_SIGINFO) || current.sa_sigaction != on_fault) {
        // First arming, or a library a choice loaded put its own handler in: ours goes (back) in front of it.
        struct sigaction action = {};
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGSEGV, &action, &previous) != 0) return errno;
    }
    return 0;
}

// Make [start, start + length) (whole pages) read-only and watch it as `slot`; 0 or an errno.
extern "C" int tf_guard_arm(int slot, uintptr_t start, size_t length) {
    if (slot < 0 || slot >= SLOTS || length == 0) return EINVAL;
    if (const int error = tf_guard_install()) return error;
    written[slot] = 0;
    lo[slot] = start;
    hi[slot] = start + length;
    if (mprotect((void*)start, length, PROT_READ) != 0) {
        const int error = errno;
        hi[slot] = lo[slot] = 0;
        return error;
    }
    return 0;
}

// Whether anything wrote into `slot`'s pages since it was armed.
extern "C" int tf_guard_written(int slot) { return slot >= 0 && slot < SLOTS && written[slot]; }

// Make `slot`'s pages writable again and stop watching them; 0 or an errno.
extern "C" int tf_guard_disarm(int slot) {
    if (slot < 0 || slot >= SLOTS || lo[slot] >= hi[slot]) return 0;
    const int error = mprotect((void*)lo[slot], hi[slot] - lo[slot], PROT_READ | PROT_WRITE) == 0 ? 0 : errno;
    hi[slot] = lo[slot] = 0;
    return error;
}
