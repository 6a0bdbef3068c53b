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
bool installed = false;

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
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {
        signal(sig, SIG_DFL);  // the faulting instruction runs again, and its fault takes the default action
    }
}
}  // namespace

// Make [start, start + length) (whole pages) read-only and watch it as `slot`; 0 or an errno.
extern "C" int tf_guard_arm(int slot, uintptr_t start, size_t length) {
    if (slot < 0 || slot >= SLOTS || length == 0) return EINVAL;
    if (!installed) {
        struct sigaction action = {};
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGSEGV, &action, &previous) != 0) return errno;
        installed = true;
    }
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
