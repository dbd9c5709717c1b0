#include "comm/launch/torchrun.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/launch/launcher.h"
#include "comm/store/torchrun_store.h"

namespace loom::comm::launch {
namespace {

std::string RunPrefix(const RankInfo& info) {
  return absl::StrCat("loom/", info.torchrun_run_id.empty() ? "none" : info.torchrun_run_id);
}

// "<start> <host>:<port>" -> host, port.
bool ParseAnnouncement(const std::string& v, std::string* host, int* port) {
  std::vector<std::string> parts = absl::StrSplit(v, ' ');
  if (parts.size() != 2) return false;
  const size_t colon = parts[1].rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(parts[1].substr(colon + 1), port)) {
    return false;
  }
  *host = parts[1].substr(0, colon);
  return !host->empty();
}

absl::StatusOr<std::unique_ptr<TcpStore>> ServeAndAnnounce(const RankInfo& info,
                                                           TcpStoreOptions options,
                                                           TorchrunStore& board) {
  absl::StatusOr<int64_t> starts = board.Add(TorchrunStartsKey(info), 1);
  if (!starts.ok()) return starts.status();
  const int start = static_cast<int>(*starts - 1);
  options.is_server = true;
  options.host = board.local_address();
  options.port = 0;  // any free port: torchrun may own every port it was given
  if (options.host.empty()) {
    return absl::UnavailableError(
        absl::StrCat("rank 0 could not tell its own address on the route to ", board.Describe()));
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(options);
  if (!store.ok()) return store.status();
  absl::Status s = (*store)->Set(kTorchrunStartKey, absl::StrCat(start));
  const std::string address = absl::StrCat(options.host, ":", (*store)->port());
  if (s.ok()) s = board.Set(TorchrunAnnounceKey(info), absl::StrCat(start, " ", address));
  if (!s.ok()) return s;
  SetRestartCount(start);
  std::fprintf(stderr,
               "loom: torchrun run '%s', start %d of this job (TORCHELASTIC_RESTART_COUNT=%d "
               "here): rank 0 serves the job's store at %s (announced in %s)\n",
               info.torchrun_run_id.c_str(), start, info.torchrun_restart_count, address.c_str(),
               board.Describe().c_str());
  return store;
}

absl::StatusOr<std::unique_ptr<TcpStore>> FindAndJoin(const RankInfo& info,
                                                      TcpStoreOptions options,
                                                      TorchrunStore& board) {
  const absl::Duration within = options.connect_timeout;
  const absl::Time deadline = absl::Now() + within;
  std::string last = "no announcement yet";
  for (;;) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<std::string> announced = board.Get(TorchrunAnnounceKey(info), left);
    if (!announced.ok()) {
      if (!absl::IsDeadlineExceeded(announced.status())) return announced.status();
    } else if (!ParseAnnouncement(*announced, &options.host, &options.port)) {
      return absl::InvalidArgumentError(absl::StrCat("torchrun's store holds '", *announced,
                                                     "' under ", TorchrunAnnounceKey(info),
                                                     ", not '<start> <host>:<port>'"));
    } else {
      // A short try: an address that does not answer is the last start's.
      options.is_server = false;
      options.connect_timeout = std::min(absl::Seconds(2), std::max(left, absl::Seconds(1)));
      absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(options);
      if (store.ok()) {
        absl::StatusOr<std::string> start_text =
            (*store)->Get(kTorchrunStartKey, absl::Seconds(10));
        int start = 0;
        if (start_text.ok() && absl::SimpleAtoi(*start_text, &start) && start >= 0) {
          SetRestartCount(start);
          return store;
        }
        last = absl::StrCat("the store at ", *announced, " has no start number");
      } else if (absl::IsPermissionDenied(store.status())) {
        // A live store that refuses the secret (or cannot prove it): a
        // mistyped secret, or an impostor. Waiting would not change either.
        return store.status();
      } else {
        last = std::string(store.status().message());
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", info.rank, " found no live store of rank 0's through torchrun's store within ",
          absl::FormatDuration(within), " (is rank 0 running? it logs where it serves); last: ",
          last));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace

std::string TorchrunAnnounceKey(const RankInfo& info) {
  return absl::StrCat(RunPrefix(info), "/store");
}

std::string TorchrunStartsKey(const RankInfo& info) {
  return absl::StrCat(RunPrefix(info), "/rank0_starts");
}

absl::StatusOr<std::unique_ptr<TcpStore>> MeetThroughTorchrun(const RankInfo& info,
                                                              TcpStoreOptions options) {
  if (!info.torchrun_agent_store) {
    return absl::FailedPreconditionError("MeetThroughTorchrun: not a rank of torchrun's");
  }
  absl::StatusOr<std::unique_ptr<TorchrunStore>> board =
      TorchrunStore::Connect(info.master_addr, info.master_port, options.connect_timeout);
  if (!board.ok()) return board.status();
  return info.rank == 0 ? ServeAndAnnounce(info, options, **board)
                        : FindAndJoin(info, options, **board);
}

}  // namespace loom::comm::launch
