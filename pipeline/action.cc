#include "pipeline/action.h"

#include "absl/strings/str_format.h"

namespace loom::pipeline {
namespace {

const char* ShortName(ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return "F";
    case ActionKind::kBackward: return "B";
    case ActionKind::kSendActivation: return "SA";
    case ActionKind::kRecvActivation: return "RA";
    case ActionKind::kSendGrad: return "SG";
    case ActionKind::kRecvGrad: return "RG";
    case ActionKind::kBackwardInput: return "I";
    case ActionKind::kBackwardWeight: return "W";
  }
  return "?";
}

const char* LongName(ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return "Forward";
    case ActionKind::kBackward: return "Backward";
    case ActionKind::kSendActivation: return "SendActivation";
    case ActionKind::kRecvActivation: return "RecvActivation";
    case ActionKind::kSendGrad: return "SendGrad";
    case ActionKind::kRecvGrad: return "RecvGrad";
    case ActionKind::kBackwardInput: return "BackwardInput";
    case ActionKind::kBackwardWeight: return "BackwardWeight";
  }
  return "?";
}

}  // namespace

std::string ToShortString(const Action& a) {
  std::string s = absl::StrFormat("%s%d.%d", ShortName(a.kind), a.micro_batch, a.chunk);
  if (IsSend(a.kind)) absl::StrAppendFormat(&s, ">%d", a.peer);
  if (IsRecv(a.kind)) absl::StrAppendFormat(&s, "<%d", a.peer);
  return s;
}

std::string ToString(const Action& a) {
  std::string s =
      absl::StrFormat("%s(micro-batch %d, chunk %d)", LongName(a.kind), a.micro_batch, a.chunk);
  if (IsSend(a.kind)) absl::StrAppendFormat(&s, " to stage %d", a.peer);
  if (IsRecv(a.kind)) absl::StrAppendFormat(&s, " from stage %d", a.peer);
  return s;
}

}  // namespace loom::pipeline
