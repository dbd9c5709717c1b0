#ifndef LOOM_CORE_SIGNAL_THREAD_H_
#define LOOM_CORE_SIGNAL_THREAD_H_

// Process-directed signals (the agent's forwarded SIGTERM, a scheduler's
// preemption notice, SIGUSR1 asking for a flight-recorder dump) go to any
// thread that does not block them: with UCX or OpenMP that is often a thread
// in the middle of a GEMM. On UCX ranks a SIGTERM handled there left a corrupt
// glibc heap in a few runs in a hundred (never without the signal, and never
// once it went to an idle thread; the cause inside the libraries is not
// known). RouteSignalsToOwnThread blocks `signals` in the calling thread, so
// in every thread it starts afterwards, and starts one idle thread that
// leaves them unblocked: the kernel delivers them there. Handlers and default
// actions stay what they are (SIGTERM without a handler still ends the
// process); only the thread they run on changes. Call it first in main,
// before any other thread exists; a thread started earlier keeps its mask.
// Signals sent to one thread (tgkill, raise) are not rerouted.

#include <initializer_list>

namespace loom::core {

void RouteSignalsToOwnThread(std::initializer_list<int> signals);

}  // namespace loom::core

#endif  // LOOM_CORE_SIGNAL_THREAD_H_
