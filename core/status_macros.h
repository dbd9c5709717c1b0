#ifndef LOOM_CORE_STATUS_MACROS_H_
#define LOOM_CORE_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr code paths.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LOOM_RETURN_IF_ERROR(expr)                   \
  do {                                               \
    ::absl::Status _loom_status = (expr);            \
    if (!_loom_status.ok()) return _loom_status;     \
  } while (0)

#define LOOM_STATUS_CONCAT_INNER(a, b) a##b
#define LOOM_STATUS_CONCAT(a, b) LOOM_STATUS_CONCAT_INNER(a, b)

// LOOM_ASSIGN_OR_RETURN(Tensor t, MakeTensor()); declares t, or returns the error.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_STATUS_CONCAT(_loom_statusor_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

#endif  // LOOM_CORE_STATUS_MACROS_H_
