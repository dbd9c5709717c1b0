#include "layers/weight_grad_store.h"

#include <utility>

namespace loom::layers {
namespace {

thread_local WeightGradStore* active_store = nullptr;

}  // namespace

WeightGradStore* WeightGradStore::Active() { return active_store; }

absl::Status WeightGradStore::RunOrDefer(Work work, int64_t bytes) {
  WeightGradStore* store = active_store;
  if (store == nullptr) return work();
  store->open_.push_back(std::move(work));
  store->bytes_ += bytes;
  return absl::OkStatus();
}

void WeightGradStore::EndUnit(int64_t unit) {
  units_.push_back({unit, std::move(open_)});
  open_.clear();
}

absl::Status WeightGradStore::Run(const std::function<absl::Status(int64_t)>& after_unit) {
  if (!open_.empty()) {
    return absl::FailedPreconditionError(
        "WeightGradStore: weight gradients deferred outside any unit (EndUnit missing)");
  }
  std::vector<Unit> units = std::move(units_);
  units_.clear();
  open_.clear();
  bytes_ = 0;
  for (Unit& u : units) {
    for (Work& w : u.work) {
      if (absl::Status s = w(); !s.ok()) return s;
      w = nullptr;  // its operands go as soon as it has run
    }
    if (absl::Status s = after_unit(u.id); !s.ok()) return s;
  }
  return absl::OkStatus();
}

DeferWeightGrads::DeferWeightGrads(WeightGradStore* store) : previous_(active_store) {
  active_store = store;
}

DeferWeightGrads::~DeferWeightGrads() { active_store = previous_; }

}  // namespace loom::layers
