// Test helper for //comm:torchrun_store_test: talks to a PyTorch TCPStore
// (started by the test's Python side) through Loom's TorchrunStore client.
//   torchrun_store_probe HOST PORT
// Sets from_loom=hello-from-loom, adds 5 to "counter", reads "from_torch"
// (set by Python), times out on a key nobody sets, then reads again on a new
// connection. Prints one line per step; exits 1 at the first failure.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "comm/store/torchrun_store.h"

int main(int argc, char** argv) {
  int port = 0;
  if (argc != 3 || !absl::SimpleAtoi(argv[2], &port)) {
    std::fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  auto fail = [](const char* what, const absl::Status& s) {
    std::printf("FAIL %s: %s\n", what, std::string(s.message()).c_str());
    return 1;
  };
  auto store = loom::comm::TorchrunStore::Connect(argv[1], port, absl::Seconds(10));
  if (!store.ok()) return fail("connect", store.status());
  std::printf("local_address %s\n", (*store)->local_address().c_str());
  absl::Status s = (*store)->Set("from_loom", "hello-from-loom");
  if (!s.ok()) return fail("set", s);
  auto added = (*store)->Add("counter", 5);
  if (!added.ok()) return fail("add", added.status());
  std::printf("add %lld\n", static_cast<long long>(*added));
  auto got = (*store)->Get("from_torch", absl::Seconds(20));
  if (!got.ok()) return fail("get", got.status());
  std::printf("get %s\n", got->c_str());
  auto missing = (*store)->Get("nobody_sets_this", absl::Milliseconds(300));
  std::printf("missing %s\n", missing.ok() ? "FOUND?!" : std::string(missing.status().message()).c_str());
  if (missing.ok() || !absl::IsDeadlineExceeded(missing.status())) return 1;
  got = (*store)->Get("from_torch", absl::Seconds(5));  // after the dropped connection
  if (!got.ok()) return fail("get again", got.status());
  std::printf("get_again %s\n", got->c_str());
  s = (*store)->Set("done", "1");
  if (!s.ok()) return fail("set done", s);
  std::printf("ok\n");
  return 0;
}
