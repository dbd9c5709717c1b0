#ifndef LOOM_PLAN_REPORT_H_
#define LOOM_PLAN_REPORT_H_

// Planning every layout and printing the table (//train:plan's output).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "plan/hardware.h"
#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"

namespace loom::plan {

struct Planned {
  train::TrainConfig config;
  StageMemory memory;  // the largest stage
  StepTime time;
  bool fits = false;
};

// Every layout with its memory and time, those that fit first, fastest
// first within each group.
absl::StatusOr<std::vector<Planned>> PlanAll(const train::TrainConfig& base, const Hardware& hw,
                                             const SearchOptions& search,
                                             const TimeOptions& time, int* rejected = nullptr,
                                             std::string* first_error = nullptr);

// The table: one row per layout (at most `rows`; 0: all).
std::string FormatTable(const std::vector<Planned>& plans, const Hardware& hw, size_t rows);

// Why the rest lose against row 1 (the fastest that fits): how many do not fit
// and which memory category is largest in them; of those that fit, how many
// are slower mostly by compute, by exposed communication or by bubble (the
// term with the largest excess over row 1's); and, for rows 2 .. `rows`, each
// term's difference to row 1.
std::string WhyTheyLose(const std::vector<Planned>& plans, const Hardware& hw, size_t rows);

// --explain: the formulas with this layout's numbers.
std::string Explain(const Planned& p, const Hardware& hw);

}  // namespace loom::plan

#endif  // LOOM_PLAN_REPORT_H_
