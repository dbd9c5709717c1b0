#ifndef LOOM_PLAN_BUILTIN_HARDWARE_H_
#define LOOM_PLAN_BUILTIN_HARDWARE_H_

// The hardware files compiled into the binaries that need a default
// (//train:gpt --auto-layout): the text of plan/testdata/cpu.textproto and
// plan/testdata/h100_dgx.textproto at build time, so no runfiles lookup.

namespace loom::plan {

extern const char kBuiltinCpuHardware[];   // plan/testdata/cpu.textproto
extern const char kBuiltinH100Hardware[];  // plan/testdata/h100_dgx.textproto

}  // namespace loom::plan

#endif  // LOOM_PLAN_BUILTIN_HARDWARE_H_
