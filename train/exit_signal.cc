#include "train/exit_signal.h"

#include <atomic>
#include <csignal>

namespace loom::train {
namespace {

// Lock-free, hence async-signal-safe, and a valid way for other threads to
// see the store (a plain volatile sig_atomic_t is not, across threads).
std::atomic<std::sig_atomic_t> g_received{0};
static_assert(std::atomic<std::sig_atomic_t>::is_always_lock_free);

void OnSigterm(int) { g_received.store(1, std::memory_order_relaxed); }

}  // namespace

void InstallExitSignalHandler() {
  struct sigaction action = {};
  action.sa_handler = OnSigterm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a blocked read or sleep carries on
  sigaction(SIGTERM, &action, nullptr);
}

bool ExitSignalReceived() { return g_received.load(std::memory_order_relaxed) != 0; }

void ResetExitSignalForTesting() { g_received.store(0, std::memory_order_relaxed); }

}  // namespace loom::train
