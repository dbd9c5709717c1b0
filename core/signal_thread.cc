#include "core/signal_thread.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

namespace loom::core {

void RouteSignalsToOwnThread(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    for (;;) pause();  // each handler runs here, then pause returns
  }).detach();
}

}  // namespace loom::core
