// //train:gpt's flags give one complete TrainConfig whose defaults are the
// struct's: the binary and the tests that build a TrainConfig{} run the same
// default job.
#include "train/gpt_flags.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "comm/launch/flags.h"
#include "core/cli.h"
#include "gtest/gtest.h"
#include "train/test_util.h"

namespace loom::train {
namespace {

void Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gpt");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  comm::launch::ParseFlags(static_cast<int>(argv.size()), argv.data(), "gpt_flags_test");
}

// Every field a flag sets (the derived ones are Finalize's).
void ExpectSameConfig(const TrainConfig& a, const TrainConfig& b) {
#define SAME(field) EXPECT_EQ(a.field, b.field) << #field
  SAME(model.num_layers);
  SAME(model.hidden_size);
  SAME(model.num_attention_heads);
  SAME(model.ffn_hidden_size);
  SAME(model.seq_length);
  SAME(model.max_position_embeddings);
  SAME(model.vocab_size);
  SAME(model.make_vocab_size_divisible_by);
  SAME(model.init_method_std);
  SAME(model.layernorm_epsilon);
  SAME(model.normalization);
  SAME(model.position_embedding_type);
  SAME(model.rotary_base);
  SAME(model.rotary_percent);
  SAME(model.swiglu);
  SAME(model.group_query_attention);
  SAME(model.num_query_groups);
  SAME(model.untie_embeddings_and_output_weights);
  SAME(model.add_bias_linear);
  SAME(model.seed);
  SAME(tensor_model_parallel_size);
  SAME(pipeline_model_parallel_size);
  SAME(num_layers_per_virtual_pipeline_stage);
  SAME(pipeline_schedule);
  SAME(sequence_parallel);
  SAME(tp_comm_overlap);
  SAME(model.moe_a2a_overlap_chunks);
  SAME(distributed_backend);
  SAME(distributed_backend_flag);
  SAME(distributed_timeout_s);
  SAME(micro_batch_size);
  SAME(global_batch_size);
  SAME(train_iters);
  SAME(lr.lr);
  SAME(lr.min_lr);
  SAME(lr.style);
  SAME(lr.warmup_iters);
  SAME(lr.decay_iters);
  SAME(optimizer.beta1);
  SAME(optimizer.beta2);
  SAME(optimizer.eps);
  SAME(optimizer.weight_decay);
  SAME(optimizer.clip_grad);
  SAME(optimizer.distributed);
  SAME(data_parallel_sharding_strategy);
  SAME(num_distributed_optimizer_instances);
  SAME(optimizer.bucket_bytes);
  SAME(hidden_dropout);
  SAME(attention_dropout);
  SAME(overlap_grad_reduce);
  SAME(overlap_param_gather);
  SAME(data_path);
  SAME(split);
  SAME(tokenizer_type);
  SAME(vocab_file);
  SAME(merge_file);
  SAME(data_cache_dir);
  SAME(log_interval);
  SAME(eval_interval);
  SAME(eval_iters);
  SAME(metrics_file);
  SAME(tensorboard_dir);
  SAME(tensorboard_log_interval);
  SAME(log_memory_to_tensorboard);
  SAME(log_validation_ppl_to_tensorboard);
  SAME(save);
  SAME(load);
  SAME(save_interval);
  SAME(checkpoint.load_iteration);
  SAME(checkpoint.keep_last);
  SAME(checkpoint.async_save);
  SAME(checkpoint.save_optim);
  SAME(checkpoint.load_optim);
  SAME(checkpoint.finetune);
  SAME(skip_train);
  SAME(exit_signal_handler);
  SAME(exit_interval);
  SAME(exit_duration_in_mins);
  SAME(fault_injection);
  SAME(peak_flops);
  SAME(sample_tokens);
  SAME(device);
  SAME(bf16);
  SAME(timing_log_level);
  SAME(log_timers_to_tensorboard);
  SAME(profile);
  SAME(profile_dir);
  SAME(profile_step_start);
  SAME(profile_step_end);
#undef SAME
}

TEST(GptFlagsTest, DefaultsAreTheStructsDefaults) {
  absl::FlagSaver saver;
  unsetenv("BUILD_WORKING_DIRECTORY");
  Parse({});
  ExpectSameConfig(ConfigFromFlags(), TrainConfig{});
  // The default job the README documents.
  const TrainConfig d;
  EXPECT_EQ(d.train_iters, 700);
  EXPECT_EQ(d.global_batch_size, 8);
  EXPECT_EQ(d.model.num_layers, 4);
  EXPECT_EQ(d.model.hidden_size, 256);
  EXPECT_EQ(d.model.num_attention_heads, 8);
  EXPECT_EQ(d.model.seq_length, 128);
  EXPECT_EQ(d.optimizer.beta2, 0.95f);
  EXPECT_EQ(d.log_interval, 50);
  EXPECT_EQ(d.eval_interval, 250);
  // Backend and timeout: ucx (nccl on GPUs) and --comm-timeout-s's default.
  EXPECT_EQ(BackendOf(d), "ucx");
  TrainConfig gpu;
  gpu.device = DeviceKind::kCuda;
  EXPECT_EQ(BackendOf(gpu), "nccl");
  EXPECT_EQ(d.distributed_timeout_s, comm::launch::CommFlags{}.timeout_s);
  const comm::launch::CommFlags comm = CommFlagsFor(ConfigFromFlags());
  EXPECT_EQ(comm.backend, "ucx");
  EXPECT_EQ(comm.timeout_s, 300);
  EXPECT_FALSE(comm.nproc_per_node_given);
}

TEST(GptFlagsTest, MegatronNamesWithDashesOrUnderscores) {
  absl::FlagSaver saver;
  Parse({"--train-iters=5", "--adam_beta2=0.999", "--tensor-model-parallel-size", "2",
         "--overlap-param-gather", "--no-load-optim", "--finetune", "--skip_train",
         "--layernorm-epsilon=1e-6", "--nproc-per-node=4"});
  const TrainConfig c = ConfigFromFlags();
  EXPECT_EQ(c.train_iters, 5);
  EXPECT_EQ(c.optimizer.beta2, 0.999f);
  EXPECT_EQ(c.tensor_model_parallel_size, 2);
  EXPECT_TRUE(c.overlap_param_gather);
  EXPECT_FALSE(c.checkpoint.load_optim);
  EXPECT_TRUE(c.checkpoint.finetune);
  EXPECT_TRUE(c.skip_train);
  EXPECT_EQ(c.model.layernorm_epsilon, 1e-6f);
  const comm::launch::CommFlags comm = CommFlagsFor(c);
  EXPECT_TRUE(comm.nproc_per_node_given);
  EXPECT_EQ(comm.nproc_per_node, 4);
}

TEST(GptFlagsTest, TensorBoardFlags) {
  absl::FlagSaver saver;
  unsetenv("BUILD_WORKING_DIRECTORY");
  Parse({"--tensorboard-dir=/tmp/runs", "--tensorboard-log-interval=5",
         "--log-memory-to-tensorboard", "--log_validation_ppl_to_tensorboard"});
  const TrainConfig c = ConfigFromFlags();
  EXPECT_EQ(c.tensorboard_dir, "/tmp/runs");
  EXPECT_EQ(c.tensorboard_log_interval, 5);
  EXPECT_TRUE(c.log_memory_to_tensorboard);
  EXPECT_TRUE(c.log_validation_ppl_to_tensorboard);
  EXPECT_EQ(TrainConfig{}.tensorboard_log_interval, 1);  // Megatron's default
}

TEST(GptFlagsTest, TimerAndProfileFlags) {
  absl::FlagSaver saver;
  unsetenv("BUILD_WORKING_DIRECTORY");
  Parse({"--timing-log-level=2", "--log-timers-to-tensorboard", "--profile",
         "--profile-dir=/tmp/prof", "--profile-step-start=3", "--profile_step_end=5"});
  const TrainConfig c = ConfigFromFlags();
  EXPECT_EQ(c.timing_log_level, 2);
  EXPECT_TRUE(c.log_timers_to_tensorboard);
  EXPECT_TRUE(c.profile);
  EXPECT_EQ(c.profile_dir, "/tmp/prof");
  EXPECT_EQ(c.profile_step_start, 3);
  EXPECT_EQ(c.profile_step_end, 5);
  // Megatron's defaults.
  EXPECT_EQ(TrainConfig{}.timing_log_level, 0);
  EXPECT_EQ(TrainConfig{}.profile_step_start, 10);
  EXPECT_EQ(TrainConfig{}.profile_step_end, 12);
}

TEST(GptFlagsTest, ExitFlagsAndFaultVariable) {
  {
    absl::FlagSaver saver;
    unsetenv("LOOM_FAULT");
    Parse({});
    const TrainConfig c = ConfigFromFlags();
    EXPECT_FALSE(c.exit_signal_handler);
    EXPECT_FALSE(c.exit_interval.has_value());
    EXPECT_FALSE(c.exit_duration_in_mins.has_value());
    EXPECT_EQ(c.fault_injection, "");
  }
  {
    absl::FlagSaver saver;
    setenv("LOOM_FAULT", "rank=0,iteration=3,kind=bogus", 1);
    Parse({"--exit-signal-handler", "--exit-interval=0", "--exit_duration_in_mins=1.5",
           "--save=/tmp/ckpt"});
    TrainConfig c = ConfigFromFlags();
    unsetenv("LOOM_FAULT");
    EXPECT_TRUE(c.exit_signal_handler);
    EXPECT_EQ(c.exit_interval, 0);
    EXPECT_EQ(c.exit_duration_in_mins, 1.5);
    EXPECT_EQ(c.fault_injection, "rank=0,iteration=3,kind=bogus");
    // Given as 0: an error naming the flag, not "off".
    absl::Status s = Finalize(&c, 1);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--exit-interval (0) must be >= 1"), std::string::npos) << s;
    c.exit_interval = 10;
    s = Finalize(&c, 1);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("LOOM_FAULT=rank=0,iteration=3,kind=bogus: unknown kind=bogus"),
              std::string::npos)
        << s;
  }
}

TEST(GptFlagsTest, LlamaStyleModelFlags) {
  {
    absl::FlagSaver saver;
    Parse({"--normalization=RMSNorm", "--norm-epsilon=1e-6", "--position-embedding-type=rope",
           "--rotary-base=500000", "--rotary-percent=0.5", "--swiglu", "--group-query-attention",
           "--num-query-groups=2", "--untie-embeddings-and-output-weights",
           "--disable-bias-linear"});
    const TrainConfig c = ConfigFromFlags();
    EXPECT_EQ(c.model.normalization, layers::Normalization::kRMSNorm);
    EXPECT_EQ(c.model.layernorm_epsilon, 1e-6f);
    EXPECT_TRUE(c.model.rope());
    EXPECT_EQ(c.model.rotary_base, 500000.0f);
    EXPECT_EQ(c.model.rotary_percent, 0.5f);
    EXPECT_TRUE(c.model.swiglu);
    EXPECT_TRUE(c.model.group_query_attention);
    EXPECT_EQ(c.model.query_groups(), 2);
    EXPECT_TRUE(c.model.untie_embeddings_and_output_weights);
    EXPECT_FALSE(c.model.add_bias_linear);
    TrainConfig f = c;
    EXPECT_TRUE(Finalize(&f, 1).ok());
  }
  {
    absl::FlagSaver saver;
    Parse({"--layernorm-epsilon=1e-3"});  // the older name still works
    EXPECT_EQ(ConfigFromFlags().model.layernorm_epsilon, 1e-3f);
  }
  {
    absl::FlagSaver saver;
    // An enum is parsed at the flag boundary: a misspelt value is refused by
    // the command-line check, as typed and with the choices, before any work.
    absl::Status s = core::CheckFlagArgs({"gpt", "--normalization=RMSnorm"});
    EXPECT_EQ(s.message(),
              "--normalization=RMSnorm: Illegal value 'RMSnorm': expected one of LayerNorm | "
              "RMSNorm");
    s = core::CheckFlagArgs({"gpt", core::NormalizeFlagName("--position-embedding-type"), "alibi"});
    EXPECT_NE(s.message().find("'alibi': expected one of learned_absolute | rope"),
              std::string::npos)
        << s;
    // The execution options' enums too ("" is Megatron's unset: no recomputation).
    s = core::CheckFlagArgs({"gpt", core::NormalizeFlagName("--recompute-granularity=everything")});
    EXPECT_NE(s.message().find("'everything': expected one of \"\" | full | selective"),
              std::string::npos)
        << s;
    s = core::CheckFlagArgs({"gpt", core::NormalizeFlagName("--lr-decay-style=step"),
                             core::NormalizeFlagName("--moe-router-load-balancing-type=sinkhorn")});
    EXPECT_NE(s.message().find("--lr-decay-style=step: Illegal value 'step': expected one of "
                               "constant | linear | cosine"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("'sinkhorn': expected one of aux_loss | none"), std::string::npos)
        << s;
    // zbh1 is an alias (accepted, not listed); zigzag is no schedule.
    s = core::CheckFlagArgs({"gpt", core::NormalizeFlagName("--pipeline-schedule=zigzag")});
    EXPECT_NE(s.message().find("'zigzag': expected one of gpipe | 1f1b | interleaved | zb-h1 | zbv"),
              std::string::npos)
        << s;
    EXPECT_TRUE(core::CheckFlagArgs({"gpt", core::NormalizeFlagName("--pipeline-schedule=zbh1")})
                    .ok());
    // Megatron's sharding strategies, exactly ("" is unset: --use-distributed-optimizer decides).
    s = core::CheckFlagArgs(
        {"gpt", core::NormalizeFlagName("--data-parallel-sharding-strategy=zero3")});
    EXPECT_EQ(s.message(),
              "--data-parallel-sharding-strategy=zero3: Illegal value 'zero3': expected one of "
              "\"\" | no_shard | optim | optim_grads | optim_grads_params");
    Parse({"--data-parallel-sharding-strategy=optim_grads_params",
           "--num-distributed-optimizer-instances=2"});
    EXPECT_EQ(ConfigFromFlags().data_parallel_sharding_strategy,
              ShardingStrategy::kOptimGradsParams);
    EXPECT_EQ(ConfigFromFlags().num_distributed_optimizer_instances, 2);
    // Megatron-FSDP's command line, as its users type it.
    Parse({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"});
    EXPECT_EQ(ConfigFromFlags().data_parallel_sharding_strategy, ShardingStrategy::kOptimGrads);
  }
  {
    absl::FlagSaver saver;
    Parse({"--group-query-attention", "--num-query-groups=3", "--num-attention-heads=8",
           "--hidden-size=64"});
    TrainConfig c = ConfigFromFlags();
    absl::Status s = Finalize(&c, 1);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--num-attention-heads (8) is not divisible by --num-query-groups (3)"),
              std::string::npos)
        << s;
  }
  {
    absl::FlagSaver saver;
    Parse({"--group-query-attention", "--num-query-groups=2", "--tensor-model-parallel-size=4"});
    TrainConfig c = ConfigFromFlags();
    absl::Status s = Finalize(&c, 4);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--num-query-groups (2) is not divisible by "
                               "--tensor-model-parallel-size (4)"),
              std::string::npos)
        << s;
  }
}

TEST(GptFlagsTest, BackendAndTimeoutInOnePlace) {
  {
    absl::FlagSaver saver;
    Parse({"--distributed-backend=carrier-pigeon", "--distributed-timeout-minutes=2"});
    TrainConfig c = ConfigFromFlags();
    EXPECT_EQ(c.distributed_backend, "carrier-pigeon");
    EXPECT_EQ(c.distributed_timeout_s, 120);
    EXPECT_EQ(CommFlagsFor(c).timeout_s, 120);
    absl::Status s = Finalize(&c, 2);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--distributed-backend=carrier-pigeon"), std::string::npos) << s;
  }
  {
    absl::FlagSaver saver;
    Parse({"--backend=pigeon", "--comm-timeout-s=7"});  // Loom's generic names
    TrainConfig c = ConfigFromFlags();
    EXPECT_EQ(c.distributed_backend, "pigeon");
    EXPECT_EQ(c.distributed_backend_flag, "--backend");
    EXPECT_EQ(c.distributed_timeout_s, 7);
    absl::Status s = Finalize(&c, 2);
    EXPECT_NE(s.message().find("--backend=pigeon"), std::string::npos) << s;
  }
  {
    absl::FlagSaver saver;
    Parse({"--backend=mpi", "--distributed-backend=local"});  // the Megatron name wins
    EXPECT_EQ(ConfigFromFlags().distributed_backend, "local");
    EXPECT_EQ(CommFlagsFor(ConfigFromFlags()).backend, "local");
  }
}

TEST(GptFlagsTest, PathsAreTakenFromWhereBazelRunStarted) {
  absl::FlagSaver saver;
  setenv("BUILD_WORKING_DIRECTORY", "/home/me", 1);
  Parse({"--data-path=data/my", "--data-cache-dir=/abs/cache", "--save=ckpt",
         "--metrics-file=m.jsonl", "--tensorboard-dir=runs/a"});
  const TrainConfig c = ConfigFromFlags();
  unsetenv("BUILD_WORKING_DIRECTORY");
  EXPECT_EQ(c.data_path, "/home/me/data/my");
  EXPECT_EQ(c.data_cache_dir, "/abs/cache");
  EXPECT_EQ(c.save, "/home/me/ckpt");
  EXPECT_EQ(c.metrics_file, "/home/me/m.jsonl");
  EXPECT_EQ(c.tensorboard_dir, "/home/me/runs/a");
}

}  // namespace
}  // namespace loom::train

// --load takes the model flags not typed from the checkpoint's manifest.
namespace loom::train {
namespace {

TEST(CheckpointArgsTest, UntypedModelFlagsComeFromTheCheckpoint) {
  const testing::Layout l{1, 1, 1};
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/llama_args";
  TrainConfig saver = testing::TinyLlamaConfig(l, 2);
  saver.save = dir;
  ASSERT_TRUE(testing::Run(saver, l).status.ok());

  // A default GPT-2 model on the command line, nothing typed: the Llama-style
  // checkpoint's architecture wins and the run continues from it.
  TrainConfig c = testing::TinyConfig(l, 4);
  c.model = TrainConfig{}.model;
  c.load = dir;
  absl::StatusOr<std::string> line = ApplyCheckpointModelArgs(&c, {"load", "train_iters"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_NE(line->find("model flags from checkpoint " + dir + "/iter_0000002"), std::string::npos)
      << *line;
  EXPECT_NE(line->find("--hidden-size=32"), std::string::npos) << *line;
  EXPECT_NE(line->find("--normalization=RMSNorm"), std::string::npos) << *line;
  EXPECT_NE(line->find("--disable-bias-linear=true"), std::string::npos) << *line;
  EXPECT_EQ(c.model.normalization, layers::Normalization::kRMSNorm);
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(c.model.num_query_groups, 2);
  EXPECT_FALSE(c.model.add_bias_linear);
  testing::RunResult r = testing::Run(c, l);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.losses.size(), 2u);

  // Typed and equal: fine; typed and different: the error names the flag.
  TrainConfig same = c;
  EXPECT_TRUE(ApplyCheckpointModelArgs(&same, {"hidden_size", "swiglu"}).ok());
  TrainConfig wrong = testing::TinyConfig(l, 4);
  wrong.model = TrainConfig{}.model;
  wrong.model.hidden_size = 64;
  wrong.load = dir;
  absl::StatusOr<std::string> bad = ApplyCheckpointModelArgs(&wrong, {"hidden_size"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--hidden-size is 32 in checkpoint"), std::string::npos)
      << bad.status();
  TrainConfig no_swiglu = c;
  no_swiglu.model.swiglu = false;
  bad = ApplyCheckpointModelArgs(&no_swiglu, {"noswiglu"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--swiglu is true in checkpoint"), std::string::npos)
      << bad.status();

  // No --load, or nothing there yet: unchanged.
  TrainConfig none = testing::TinyConfig(l, 4);
  none.load = std::string(getenv("TEST_TMPDIR")) + "/nothing_here";
  EXPECT_EQ(*ApplyCheckpointModelArgs(&none, {}), "");
}

}  // namespace
}  // namespace loom::train
