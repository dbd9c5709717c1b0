#include "plan/hardware.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace loom::plan {
namespace {

class Collector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error.empty()) error = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  std::string error;
};

const Collective& Pick(const Link& link, CollectiveKind kind) {
  const Collective* c = &link.all_reduce();
  switch (kind) {
    case CollectiveKind::kAllReduce: break;
    case CollectiveKind::kAllGather: if (link.has_all_gather()) c = &link.all_gather(); break;
    case CollectiveKind::kReduceScatter:
      if (link.has_reduce_scatter()) c = &link.reduce_scatter();
      break;
    case CollectiveKind::kAllToAll: if (link.has_all_to_all()) c = &link.all_to_all(); break;
    case CollectiveKind::kSendRecv: if (link.has_send_recv()) c = &link.send_recv(); break;
  }
  return *c;
}

// Linear in log(flops) between the points, clamped at both ends.
double Interpolate(const google::protobuf::RepeatedPtrField<GemmPoint>& c, double flops) {
  if (flops <= c[0].flops()) return c[0].efficiency();
  for (int i = 1; i < c.size(); ++i) {
    if (flops <= c[i].flops()) {
      const double t = (std::log(flops) - std::log(c[i - 1].flops())) /
                       (std::log(c[i].flops()) - std::log(c[i - 1].flops()));
      return c[i - 1].efficiency() + t * (c[i].efficiency() - c[i - 1].efficiency());
    }
  }
  return c[c.size() - 1].efficiency();
}

}  // namespace

absl::StatusOr<Hardware> ParseHardware(const std::string& text, const std::string& what) {
  Hardware hw;
  google::protobuf::TextFormat::Parser parser;
  Collector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &hw)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hardware=", what, ": not a loom.plan.Hardware in protobuf text format (",
        errors.error, "); see plan/hardware.proto and plan/testdata/*.textproto"));
  }
  auto need = [&](bool ok, const char* field) -> absl::Status {
    if (ok) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--hardware=", what, ": ", field, " must be > 0 (see plan/hardware.proto)"));
  };
  for (const auto& [ok, field] : std::initializer_list<std::pair<bool, const char*>>{
           {hw.device_memory_bytes() > 0, "device_memory_bytes"},
           {hw.peak_flops() > 0, "peak_flops"},
           {hw.memory_bandwidth() > 0, "memory_bandwidth"},
           {hw.devices_per_node() > 0, "devices_per_node"},
           {hw.intra_node().all_reduce().bus_bandwidth() > 0, "intra_node.all_reduce.bus_bandwidth"},
           {hw.inter_node().all_reduce().bus_bandwidth() > 0, "inter_node.all_reduce.bus_bandwidth"},
       }) {
    if (absl::Status s = need(ok, field); !s.ok()) return s;
  }
  for (const auto& [curve, name] :
       {std::make_pair(hw.mutable_gemm_efficiency(), "gemm_efficiency"),
        std::make_pair(hw.mutable_attention_curve(), "attention_curve")}) {
    for (const GemmPoint& p : *curve) {
      if (!(p.flops() > 0) || !(p.efficiency() > 0) || p.efficiency() > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--hardware=", what, ": every ", name, " needs flops > 0 and efficiency in (0, 1] "
            "(got flops ", p.flops(), ", efficiency ", p.efficiency(), ")"));
      }
    }
    std::sort(curve->begin(), curve->end(),
              [](const GemmPoint& a, const GemmPoint& b) { return a.flops() < b.flops(); });
  }
  // Optional rates: absent (0) falls back; a negative one is a typo.
  for (const auto& [value, field] : std::initializer_list<std::pair<double, const char*>>{
           {hw.elementwise_bandwidth(), "elementwise_bandwidth"},
           {hw.optimizer_bandwidth(), "optimizer_bandwidth"},
           {hw.attention_backward_ratio(), "attention_backward_ratio"}}) {
    if (value < 0 || std::isnan(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--hardware=", what, ": ", field, " must be > 0, or absent (got ", value,
          "; see plan/hardware.proto)"));
    }
  }
  if (hw.compute_dtype_bytes() == 0) hw.set_compute_dtype_bytes(2);
  return hw;
}

absl::StatusOr<Hardware> LoadHardware(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--hardware=", path,
                                            ": cannot open (plan/testdata has cpu.textproto, "
                                            "h100_dgx.textproto, a100_dgx.textproto)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseHardware(text.str(), path);
}

double GemmEfficiency(const Hardware& hw, double flops) {
  if (hw.gemm_efficiency().empty()) return 1.0;
  return Interpolate(hw.gemm_efficiency(), flops);
}

double GemmSeconds(const Hardware& hw, double m, double n, double k, int ranks_on_node) {
  const double flops = 2 * m * n * k;
  if (flops <= 0) return 0;
  const double share = hw.ranks_share_compute() ? std::max(1, ranks_on_node) : 1;
  return flops * share / (hw.peak_flops() * GemmEfficiency(hw, flops));
}

double MemorySeconds(const Hardware& hw, double bytes, int ranks_on_node) {
  const double share = hw.ranks_share_compute() ? std::max(1, ranks_on_node) : 1;
  return bytes * share / hw.memory_bandwidth();
}

double ElementwiseSeconds(const Hardware& hw, double bytes, int ranks_on_node) {
  if (!(hw.elementwise_bandwidth() > 0)) return MemorySeconds(hw, bytes, ranks_on_node);
  const double share = hw.ranks_share_compute() ? std::max(1, ranks_on_node) : 1;
  return bytes * share / hw.elementwise_bandwidth();
}

double OptimizerSeconds(const Hardware& hw, double bytes, int ranks_on_node) {
  if (!(hw.optimizer_bandwidth() > 0)) return MemorySeconds(hw, bytes, ranks_on_node);
  const double share = hw.ranks_share_compute() ? std::max(1, ranks_on_node) : 1;
  return bytes * share / hw.optimizer_bandwidth();
}

double AttentionSeconds(const Hardware& hw, double flops, int ranks_on_node) {
  if (flops <= 0) return 0;
  const double share = hw.ranks_share_compute() ? std::max(1, ranks_on_node) : 1;
  if (!hw.attention_curve().empty()) {
    return flops * share / (hw.peak_flops() * Interpolate(hw.attention_curve(), flops));
  }
  const double factor = hw.attention_efficiency() > 0 ? hw.attention_efficiency() : 1.0;
  return flops * share / (hw.peak_flops() * GemmEfficiency(hw, flops) * factor);
}

double AttentionBackwardRatio(const Hardware& hw) {
  return hw.attention_backward_ratio() > 0 ? hw.attention_backward_ratio() : 2.5;
}

double CollectiveSeconds(const Hardware& hw, CollectiveKind kind, double bytes, int group,
                         bool inter_node, int ranks_per_node) {
  if (group <= 1 || bytes <= 0) return 0;
  const Collective& c = Pick(inter_node ? hw.inter_node() : hw.intra_node(), kind);
  const double n = group;
  double factor = (n - 1) / n;
  if (kind == CollectiveKind::kAllReduce) factor *= 2;
  if (kind == CollectiveKind::kSendRecv) factor = 1;
  // Ring steps (NCCL's tuning model): per pass n − 1, of which nodes − 1 cross
  // the network when inter_node and the rest stay on a node.
  double steps_latency = 0;
  if (kind != CollectiveKind::kSendRecv) {
    const double passes = kind == CollectiveKind::kAllReduce ? 2 : 1;
    const double per_node = inter_node ? std::clamp(ranks_per_node, 1, group) : group;
    const double nodes = inter_node ? std::ceil(n / per_node) : 1;
    const double net_steps = inter_node ? nodes - 1 : 0;
    const double node_steps = (n - 1) - net_steps;
    const double node_step =
        inter_node ? Pick(hw.intra_node(), kind).step_latency() : c.step_latency();
    steps_latency =
        passes * (net_steps * (inter_node ? c.step_latency() : 0) + node_steps * node_step);
  }
  // Over the network with k of the group's ranks on each node, NCCL runs k
  // rings side by side, each leaving a node through another rank's NIC (one
  // per GPU on a DGX): k NICs carry the traffic, up to the intra-node link.
  double bus_bandwidth = c.bus_bandwidth();
  if (inter_node && ranks_per_node > 1) {
    bus_bandwidth = std::min(std::min(ranks_per_node, group) * c.bus_bandwidth(),
                             Pick(hw.intra_node(), kind).bus_bandwidth());
  }
  return c.latency() + steps_latency + factor * bytes / bus_bandwidth;
}

}  // namespace loom::plan
