#ifndef LOOM_TRAIN_EXIT_SIGNAL_H_
#define LOOM_TRAIN_EXIT_SIGNAL_H_

// --exit-signal-handler (Megatron's): SIGTERM, a scheduler's preemption
// notice, does not kill the process; it sets a flag the trainer reads after
// every step, and the ranks then agree (trainer.cc), save and exit 0.
//
// The handler only stores to a lock-free atomic (async-signal-safe), which
// every thread of the process reads: with ranks as threads
// (--distributed-backend=local) all ranks see one signal.

namespace loom::train {

// Installs the SIGTERM handler (process-wide; calling it again is harmless).
void InstallExitSignalHandler();
// True once SIGTERM arrived after InstallExitSignalHandler().
bool ExitSignalReceived();
// Forgets a received signal (tests run several trainers in one process).
void ResetExitSignalForTesting();

}  // namespace loom::train

#endif  // LOOM_TRAIN_EXIT_SIGNAL_H_
