// bazel run //checkpoint:import -- --hf-dir=DIR --save=CKPT
//     [--target-tensor-parallel-size=N --target-pipeline-parallel-size=M] [--seq-length=S]
//
// Imports a Hugging Face GPT2LMHeadModel / LlamaForCausalLM / MistralForCausalLM /
// MixtralForCausalLM folder (config.json + safetensors, single or sharded) as a
// Loom checkpoint at iteration 0 without optimizer state, and prints the
// //train:gpt model flags that load it.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "checkpoint/file_util.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/import.h"
#include "core/cli.h"

ABSL_FLAG(std::string, hf_dir, "", "Hugging Face model folder (config.json + safetensors)");
ABSL_FLAG(std::string, save, "", "Loom checkpoint folder to write");
ABSL_FLAG(int32_t, target_tensor_parallel_size, 1, "TP size of the written layout");
ABSL_FLAG(int32_t, target_pipeline_parallel_size, 1, "PP size of the written layout");
ABSL_FLAG(int64_t, seq_length, 0, "--seq-length recorded (0: min(max_position_embeddings, 1024))");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Imports a Hugging Face model: --hf-dir=DIR --save=CKPT "
      "[--target-tensor-parallel-size=N --target-pipeline-parallel-size=M] [--seq-length=S]");
  loom::core::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  namespace hf = loom::checkpoint::hf;
  hf::ImportOptions o;
  o.hf_dir = loom::core::ResolveUserPath(absl::GetFlag(FLAGS_hf_dir));
  o.save_dir = loom::core::ResolveUserPath(absl::GetFlag(FLAGS_save));
  o.target_tp = absl::GetFlag(FLAGS_target_tensor_parallel_size);
  o.target_pp = absl::GetFlag(FLAGS_target_pipeline_parallel_size);
  o.seq_length = absl::GetFlag(FLAGS_seq_length);
  if (o.hf_dir.empty() || o.save_dir.empty()) {
    std::fprintf(stderr, "import: --hf-dir and --save are required\n");
    return 2;
  }
  absl::Status s = hf::ImportHuggingFace(o);
  if (!s.ok()) {
    std::fprintf(stderr, "import: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  auto config = hf::ReadHfConfig(loom::checkpoint::JoinPath(o.hf_dir, "config.json"));
  std::printf("import: wrote %s/iter_0000000 (TP %d x PP %d) from %s\n", o.save_dir.c_str(),
              o.target_tp, o.target_pp, o.hf_dir.c_str());
  if (config.ok()) {
    std::printf("//train:gpt model flags: %s --seq-length=%lld\n",
                hf::GptFlagsString(*config).c_str(),
                static_cast<long long>(hf::GptConfigFromHf(*config, o.seq_length).seq_length));
  }
  return 0;
}
