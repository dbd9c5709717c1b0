#include "train/flag_groups.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cli.h"
#include "models/gpt/gpt_architecture.h"

namespace loom::train {
namespace {

// The model's flags: the architecture's, as models/gpt/gpt_architecture.h lists
// them, then the initialisation and how MoE layers run.
std::vector<const char*> ModelFlags() {
  std::vector<const char*> flags;
  for (const layers::ArchitectureField& f : layers::ArchitectureFields()) {
    flags.push_back(f.flag.data());  // a string literal: NUL-terminated
  }
  for (const char* f : {"layernorm_epsilon", "init_method_std", "moe_router_load_balancing_type",
                        "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_expert_capacity_factor",
                        "moe_pad_expert_input_to_capacity", "moe_grouped_gemm",
                        "moe_a2a_overlap_chunks"}) {
    flags.push_back(f);
  }
  return flags;
}

}  // namespace

const std::vector<FlagGroup>& GptFlagGroups() {
  static const auto* groups = new std::vector<FlagGroup>{
      {"Model", ModelFlags()},
      // Megatron's "distributed" arguments, and where the ranks compute.
      {"Parallelism and placement",
       {"tensor_model_parallel_size", "sequence_parallel", "tp_comm_overlap",
        "pipeline_model_parallel_size",
        "num_layers_per_virtual_pipeline_stage", "pipeline_schedule", "context_parallel_size",
        "expert_model_parallel_size", "use_distributed_optimizer",
        "data_parallel_sharding_strategy", "use_megatron_fsdp", "allow_unproven_gpu_sharding",
        "num_distributed_optimizer_instances",
        "overlap_grad_reduce",
        "overlap_param_gather", "ddp_bucket_size", "distributed_backend",
        "distributed_timeout_minutes", "device", "auto_layout", "hardware"}},
      {"Data",
       {"data_path", "split", "train_data_path", "valid_data_path", "test_data_path",
        "mock_data", "reset_position_ids", "reset_attention_mask", "eod_mask_loss", "sft",
        "allow_unproven_gpu_packing", "tokenizer_type", "vocab_file", "merge_file", "tokenizer_model",
        "data_cache_path", "data_cache_dir"}},
      {"Training: batches, learning rate, optimizer, regularization, precision, recomputation",
       {"micro_batch_size", "global_batch_size", "train_iters", "skip_train", "seed", "lr",
        "lr_decay_style", "lr_warmup_iters", "lr_decay_iters", "min_lr", "weight_decay",
        "clip_grad", "adam_beta1", "adam_beta2", "adam_eps", "hidden_dropout",
        "attention_dropout", "bf16", "recompute_granularity", "recompute_method",
        "recompute_num_layers", "eval_interval", "eval_iters", "exit_signal_handler",
        "exit_interval", "exit_duration_in_mins"}},
      {"Checkpointing",
       {"save", "save_interval", "keep_last", "async_save", "no_save_optim", "load",
        "load_iteration", "no_load_optim", "finetune"}},
      {"Logging and profiling",
       {"log_interval", "timing_log_level", "log_straggler", "straggler_minmax_count",
        "disable_straggler_on_startup", "straggler_ctrlr_port", "metrics_file", "memory_report",
        "tensorboard_dir", "tensorboard_log_interval", "log_memory_to_tensorboard",
        "log_validation_ppl_to_tensorboard", "log_timers_to_tensorboard", "profile",
        "profile_dir", "profile_step_start", "profile_step_end", "peak_flops",
        "sample_tokens"}},
      // comm/launch/flags.cc: torchrun's names where torchrun has one.
      {"Launch: launcher, agent, rendezvous",
       {"backend", "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port",
        "rank", "world_size", "local_rank", "store", "rendezvous_secret", "network",
        "comm_timeout_s", "max_restarts", "heartbeat_timeout_s", "flight_recorder_dir",
        "flight_recorder_entries"}},
  };
  return *groups;
}

FlagGroupProblems CheckFlagGroups(const std::vector<FlagGroup>& groups,
                                  const std::set<std::string>& flags) {
  FlagGroupProblems p;
  std::map<std::string, int> seen;
  for (const FlagGroup& g : groups) {
    for (const char* name : g.flags) {
      if (++seen[name] == 2) p.repeated.push_back(name);
      if (seen[name] == 1 && flags.count(name) == 0) p.not_flags.push_back(name);
    }
  }
  for (const std::string& name : flags) {
    if (seen.count(name) == 0) p.ungrouped.push_back(name);
  }
  return p;
}

std::string FlagGroupProblems::ToString() const {
  auto dashed = [](std::string* out, const std::string& name) {
    out->append(core::DashedFlag(name));
  };
  std::vector<std::string> lines;
  if (!ungrouped.empty()) {
    lines.push_back(absl::StrCat("flags in no --help group (add them to train/flag_groups.cc): ",
                                 absl::StrJoin(ungrouped, " ", dashed)));
  }
  if (!not_flags.empty()) {
    lines.push_back(absl::StrCat("train/flag_groups.cc names what is no flag of this binary: ",
                                 absl::StrJoin(not_flags, " ", dashed)));
  }
  if (!repeated.empty()) {
    lines.push_back(absl::StrCat("train/flag_groups.cc names more than once: ",
                                 absl::StrJoin(repeated, " ", dashed)));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace loom::train
