#include "comm/store/store.h"

#include "absl/strings/str_cat.h"

namespace loom::comm {

absl::Status StoreBarrier(Store& store, const std::string& name, int size,
                          absl::Duration timeout) {
  const std::string counter = absl::StrCat("barrier/", name, "/count");
  const std::string done = absl::StrCat("barrier/", name, "/done");
  absl::StatusOr<int64_t> n = store.Add(counter, 1);
  if (!n.ok()) return n.status();
  if (*n == size) {
    absl::Status s = store.Set(done, "1");
    if (!s.ok()) return s;
  }
  absl::Status s = store.Wait({done}, timeout);
  if (absl::IsDeadlineExceeded(s)) {
    absl::StatusOr<int64_t> now = store.Add(counter, 0);
    return absl::DeadlineExceededError(absl::StrCat(
        "store barrier '", name, "' on ", store.Describe(), ": only ", now.ok() ? *now : -1,
        " of ", size, " ranks arrived within ", absl::FormatDuration(timeout)));
  }
  return s;
}

}  // namespace loom::comm
