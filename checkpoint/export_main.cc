// bazel run //checkpoint:export -- --load=DIR [--load-iteration=N] --format=safetensors --out=OUT
//
//     [--dtype=f32|bf16]
// Writes OUT/model.safetensors (Hugging Face GPT-2, Llama or Mixtral tensor
// names) and OUT/config.json: transformers' GPT2LMHeadModel / LlamaForCausalLM
// / MixtralForCausalLM .from_pretrained(OUT) loads it.
#include <cstdio>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "checkpoint/export.h"
#include "checkpoint/reader.h"
#include "core/cli.h"

ABSL_FLAG(std::string, load, "", "Checkpoint folder (uses its `latest`)");
ABSL_FLAG(int64_t, load_iteration, -1, "Iteration to export (-1: the one `latest` names)");
ABSL_FLAG(std::string, format, "safetensors", "Output format (safetensors)");
ABSL_FLAG(std::string, out, "", "Output folder");
ABSL_FLAG(std::string, dtype, "f32", "Stored dtype of the safetensors: f32 | bf16");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Exports a Loom checkpoint: --load=DIR --format=safetensors --out=OUT");
  loom::core::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  if (absl::GetFlag(FLAGS_load).empty() || absl::GetFlag(FLAGS_out).empty()) {
    std::fprintf(stderr, "export: --load and --out are required\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_format) != "safetensors") {
    std::fprintf(stderr, "export: --format=%s: only safetensors is supported\n",
                 absl::GetFlag(FLAGS_format).c_str());
    return 2;
  }
  loom::checkpoint::hf::Dtype dtype;
  if (absl::GetFlag(FLAGS_dtype) == "f32") {
    dtype = loom::checkpoint::hf::Dtype::kF32;
  } else if (absl::GetFlag(FLAGS_dtype) == "bf16") {
    dtype = loom::checkpoint::hf::Dtype::kBF16;
  } else {
    std::fprintf(stderr, "export: --dtype=%s: only f32 and bf16 are supported\n",
                 absl::GetFlag(FLAGS_dtype).c_str());
    return 2;
  }
  std::optional<int64_t> it;
  if (absl::GetFlag(FLAGS_load_iteration) >= 0) it = absl::GetFlag(FLAGS_load_iteration);
  // Relative paths are the user's, also under `bazel run`.
  const std::string load = loom::core::ResolveUserPath(absl::GetFlag(FLAGS_load));
  const std::string out = loom::core::ResolveUserPath(absl::GetFlag(FLAGS_out));
  auto path = loom::checkpoint::ResolveCheckpoint(load, it);
  absl::Status s = path.ok() ? loom::checkpoint::ExportSafetensors(*path, out, dtype)
                             : path.status();
  if (!s.ok()) {
    std::fprintf(stderr, "export: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("export: wrote %s/model.safetensors and config.json from %s\n",
              absl::GetFlag(FLAGS_out).c_str(), path->c_str());
  return 0;
}
