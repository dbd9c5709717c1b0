#include "config/fault_spec.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom::train {
namespace {

constexpr char kSyntax[] =
    "expected rank=R,iteration=N,kind=exit|sigkill|hang|collective|save|slow[,ms=M (kind=slow "
    "only)][,attempt=A|any], "
    "several separated by ';' (see config/fault_spec.h)";

absl::Status Malformed(absl::string_view spec, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(kFaultVariable, "=", spec, ": ", what, "; ", kSyntax));
}

}  // namespace

const char* FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kExit: return "exit";
    case FaultKind::kSigkill: return "sigkill";
    case FaultKind::kHang: return "hang";
    case FaultKind::kCollective: return "collective";
    case FaultKind::kSave: return "save";
    case FaultKind::kSlow: return "slow";
  }
  return "unknown";
}

std::string Fault::Describe() const {
  return absl::StrCat("rank=", global_rank, " iteration=", iteration,
                      " kind=", FaultKindName(kind),
                      kind == FaultKind::kSlow ? absl::StrCat(" ms=", delay_ms) : "", " attempt=",
                      attempt == kAnyAttempt ? std::string("any") : absl::StrCat(attempt));
}

std::string FaultSpecFromEnvironment() {
  const char* v = std::getenv(kFaultVariable);
  return v == nullptr ? std::string() : std::string(v);
}

absl::StatusOr<std::vector<Fault>> ParseFaults(absl::string_view spec) {
  std::vector<Fault> faults;
  if (spec.empty()) return faults;
  if (spec.find_first_of(" \t\n") != absl::string_view::npos) {
    return Malformed(spec, "spaces are not allowed (separate keys with ',', faults with ';')");
  }
  for (absl::string_view one : absl::StrSplit(spec, ';')) {
    if (one.empty()) return Malformed(spec, "an empty fault (stray ';')");
    Fault f;
    bool has_rank = false, has_iteration = false, has_kind = false, has_attempt = false,
         has_ms = false;
    for (absl::string_view item : absl::StrSplit(one, ',')) {
      const size_t eq = item.find('=');
      if (eq == absl::string_view::npos) {
        return Malformed(spec, absl::StrCat("'", item, "' is not key=value"));
      }
      const absl::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
      auto repeated = [&](bool* seen) {
        const bool was = *seen;
        *seen = true;
        return was;
      };
      if (key == "rank") {
        if (repeated(&has_rank)) return Malformed(spec, "rank given twice in one fault");
        if (!absl::SimpleAtoi(value, &f.global_rank) || f.global_rank < 0) {
          return Malformed(spec, absl::StrCat("rank=", value, " is not a rank >= 0"));
        }
      } else if (key == "iteration") {
        if (repeated(&has_iteration)) return Malformed(spec, "iteration given twice in one fault");
        if (!absl::SimpleAtoi(value, &f.iteration) || f.iteration < 1) {
          return Malformed(spec, absl::StrCat("iteration=", value, " is not an iteration >= 1"));
        }
      } else if (key == "kind") {
        if (repeated(&has_kind)) return Malformed(spec, "kind given twice in one fault");
        bool known = false;
        for (FaultKind k : {FaultKind::kExit, FaultKind::kSigkill, FaultKind::kHang,
                            FaultKind::kCollective, FaultKind::kSave, FaultKind::kSlow}) {
          if (value == FaultKindName(k)) {
            f.kind = k;
            known = true;
          }
        }
        if (!known) return Malformed(spec, absl::StrCat("unknown kind=", value));
      } else if (key == "ms") {
        if (repeated(&has_ms)) return Malformed(spec, "ms given twice in one fault");
        // An hour at most: a longer "delay" is a hang (kind=hang).
        if (!absl::SimpleAtoi(value, &f.delay_ms) || f.delay_ms < 1 || f.delay_ms > 3600000) {
          return Malformed(spec, absl::StrCat("ms=", value, " is not a delay of 1..3600000 ms"));
        }
      } else if (key == "attempt") {
        if (repeated(&has_attempt)) return Malformed(spec, "attempt given twice in one fault");
        if (value == "any") {
          f.attempt = Fault::kAnyAttempt;
        } else if (!absl::SimpleAtoi(value, &f.attempt) || f.attempt < 0) {
          return Malformed(spec, absl::StrCat("attempt=", value, " is not a restart count >= 0 "
                                              "or 'any'"));
        }
      } else {
        return Malformed(spec, absl::StrCat("unknown key '", key, "'"));
      }
    }
    if (!has_rank || !has_iteration || !has_kind) {
      const char* missing = !has_rank ? "rank" : !has_iteration ? "iteration" : "kind";
      return Malformed(spec, absl::StrCat("'", one, "' lacks ", missing));
    }
    if (f.kind == FaultKind::kSlow && !has_ms) {
      return Malformed(spec, absl::StrCat("'", one, "' lacks ms (kind=slow's delay per step)"));
    }
    if (f.kind != FaultKind::kSlow && has_ms) {
      return Malformed(spec, absl::StrCat("'", one, "': ms is kind=slow's delay, not kind=",
                                          FaultKindName(f.kind), "'s"));
    }
    faults.push_back(f);
  }
  return faults;
}

absl::Status ValidateFaults(absl::string_view spec, int world_size, int64_t train_iters) {
  absl::StatusOr<std::vector<Fault>> faults = ParseFaults(spec);
  if (!faults.ok()) return faults.status();
  for (const Fault& f : *faults) {
    if (f.global_rank >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFaultVariable, "=", spec, ": rank=", f.global_rank, " is outside the world of ",
          world_size, " ranks (global ranks 0..", world_size - 1, ")"));
    }
    if (f.kind == FaultKind::kCollective && world_size < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFaultVariable, "=", spec, ": kind=collective needs a world of at least 2 ranks (a "
          "barrier nobody else joins)"));
    }
    if (f.iteration > train_iters) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFaultVariable, "=", spec, ": iteration=", f.iteration, " is past --train-iters (",
          train_iters, "): the fault would never fire"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::train
