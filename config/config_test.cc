#include "config/config.h"

#include "core/cpu/cpu_features.h"
#include "core/enum_names.h"
#include "gtest/gtest.h"

namespace loom::train {
namespace {

TrainConfig Base() {
  TrainConfig c;
  c.model.num_layers = 4;
  c.model.hidden_size = 64;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 32;
  return c;
}

void ExpectError(TrainConfig c, int world, const std::vector<std::string>& parts) {
  absl::Status s = Finalize(&c, world);
  ASSERT_FALSE(s.ok());
  for (const auto& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
}

TEST(ConfigTest, DerivesDataParallelAndMicroBatches) {
  TrainConfig c = Base();
  c.tensor_model_parallel_size = 2;
  c.global_batch_size = 16;
  c.micro_batch_size = 2;
  ASSERT_TRUE(Finalize(&c, 8).ok());
  EXPECT_EQ(c.data_parallel_size, 4);
  EXPECT_EQ(c.num_micro_batches, 2);
  EXPECT_EQ(c.lr.decay_iters, c.train_iters);
}

TEST(ConfigTest, DeviceAndPrecisionFlags) {
  // --device=tpu never reaches Finalize: the flag's parser refuses it.
  DeviceKind parsed;
  std::string error;
  EXPECT_FALSE(AbslParseFlag("tpu", &parsed, &error));
  EXPECT_NE(error.find("expected one of cpu | cuda"), std::string::npos) << error;
  TrainConfig c = Base();
  // --bf16 on the CPU needs AVX512_BF16 or AMX-BF16: refused by name
  // without them (forced here, so every machine checks the message) ...
  c = Base();
  c.bf16 = true;
  core::cpu::HideBf16ForTesting(true);
  ExpectError(c, 1, {"--bf16 on --device=cpu", "AVX512_BF16 or AMX-BF16", "this CPU ("});
  core::cpu::HideBf16ForTesting(false);
  // ... and with them the GEMMs compute in bf16 (f32 everything else).
  c = Base();
  c.bf16 = true;
  if (core::cpu::CheckBf16GemmSupport("test").ok()) {
    ASSERT_TRUE(Finalize(&c, 1).ok());
    EXPECT_TRUE(c.model.device.is_cpu());
    EXPECT_EQ(c.model.compute_dtype, core::DType::kBF16);
  }
  c = Base();
  c.device = DeviceKind::kCuda;
  c.bf16 = true;
  ASSERT_TRUE(Finalize(&c, 1).ok());
  EXPECT_EQ(c.model.device, core::Device::CUDA(0));
  EXPECT_EQ(c.model.compute_dtype, core::DType::kBF16);
  c = Base();
  ASSERT_TRUE(Finalize(&c, 1).ok());
  EXPECT_TRUE(c.model.device.is_cpu());
  EXPECT_EQ(c.model.compute_dtype, core::DType::kF32);
}

TEST(ConfigTest, AutomaticWarmupFitsShortRuns) {
  TrainConfig c = Base();
  c.train_iters = 10;
  c.lr.warmup_iters = -1;
  ASSERT_TRUE(Finalize(&c, 1).ok());
  EXPECT_EQ(c.lr.warmup_iters, 1);
  c = Base();
  c.train_iters = 1000;
  c.lr.warmup_iters = -1;
  ASSERT_TRUE(Finalize(&c, 1).ok());
  EXPECT_EQ(c.lr.warmup_iters, 20);
}

TEST(ConfigTest, InterleavingFromLayersPerVirtualStage) {
  TrainConfig c = Base();
  c.pipeline_model_parallel_size = 2;
  c.num_layers_per_virtual_pipeline_stage = 1;
  c.global_batch_size = 8;
  c.micro_batch_size = 2;
  ASSERT_TRUE(Finalize(&c, 2).ok());
  EXPECT_EQ(c.virtual_pipeline_size, 2);
  EXPECT_EQ(c.pipeline_schedule, pipeline::ScheduleKind::kInterleaved);
}

TEST(ConfigTest, ZeroBubbleH1) {
  for (const char* spelling : {"zb-h1", "zbh1"}) {
    TrainConfig c = Base();
    c.pipeline_model_parallel_size = 2;
    c.pipeline_schedule = core::FindEnum<pipeline::ScheduleKind>(spelling).value();
    ASSERT_TRUE(Finalize(&c, 2).ok()) << spelling;
    EXPECT_EQ(c.pipeline_schedule, pipeline::ScheduleKind::kZBH1);
    EXPECT_EQ(c.virtual_pipeline_size, 1);
  }
}

TEST(ConfigTest, RejectsInconsistentFlags) {
  TrainConfig c = Base();
  c.global_batch_size = 30;
  ExpectError(c, 2, {"--global-batch-size (30)", "--micro-batch-size (4)", "data-parallel size (2)", "= 8"});
  c = Base();
  c.tensor_model_parallel_size = 3;
  ExpectError(c, 4, {"world size (4 ranks)", "--tensor-model-parallel-size (3)"});
  c = Base();
  c.num_layers_per_virtual_pipeline_stage = 1;
  ExpectError(c, 1, {"--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-size > 1"});
  c = Base();
  c.pipeline_model_parallel_size = 2;
  c.num_layers_per_virtual_pipeline_stage = 3;
  ExpectError(c, 2, {"--num-layers (4)", "= 6"});
  c = Base();  // gpipe with interleaving: refused by the flags as typed, before any rank runs
  c.pipeline_model_parallel_size = 2;
  c.pipeline_schedule = pipeline::ScheduleKind::kGPipe;
  c.num_layers_per_virtual_pipeline_stage = 1;
  ExpectError(c, 2,
              {"--pipeline-schedule=gpipe", "--num-layers-per-virtual-pipeline-stage=1", "gives 2",
               "--pipeline-schedule=interleaved"});
  c = Base();  // zb-h1 is one chunk per stage
  c.pipeline_model_parallel_size = 2;
  c.pipeline_schedule = pipeline::ScheduleKind::kZBH1;
  c.num_layers_per_virtual_pipeline_stage = 1;
  ExpectError(c, 2, {"--pipeline-schedule=zb-h1", "one chunk per stage", "gives 2"});
  c = Base();  // the V: two chunks per stage, of num_layers / (2 PP) layers
  c.pipeline_model_parallel_size = 2;
  c.model.num_layers = 6;
  c.pipeline_schedule = pipeline::ScheduleKind::kZBV;
  ExpectError(c, 2, {"--pipeline-schedule=zbv places two chunks per stage", "--num-layers (6)",
                     "2 x --pipeline-model-parallel-size (4)"});
  c.model.num_layers = 8;
  c.num_layers_per_virtual_pipeline_stage = 1;
  ExpectError(c, 2, {"of --num-layers / (2 x --pipeline-model-parallel-size) = 2 layers each",
                     "--num-layers-per-virtual-pipeline-stage=1 disagrees"});
  c.pipeline_schedule = pipeline::ScheduleKind::kDualPipeV;  // also M >= 2 PP
  c.num_layers_per_virtual_pipeline_stage = 2;
  c.global_batch_size = 3 * c.micro_batch_size;  // DP 1
  ExpectError(c, 2, {"--pipeline-schedule=dualpipev needs at least 2 x "
                     "--pipeline-model-parallel-size = 4 micro-batches", "gives 3"});
  c.global_batch_size = 4 * c.micro_batch_size;
  c.num_layers_per_virtual_pipeline_stage = 0;  // inferred: two chunks
  TrainConfig on_gpu = c;
  ASSERT_TRUE(Finalize(&c, 2).ok());
  EXPECT_EQ(c.virtual_pipeline_size, 2);
  EXPECT_EQ(c.pipeline_schedule, pipeline::ScheduleKind::kDualPipeV);
  on_gpu.device = DeviceKind::kCuda;  // its links are untested on NCCL
  ExpectError(on_gpu, 2, {"--pipeline-schedule=dualpipev has not run on --device=cuda yet"});
  c = Base();  // zb-h1 x ZeRO-2 and ZeRO-3: GradientSync's buffers follow the split backward
  c.pipeline_model_parallel_size = 2;
  c.pipeline_schedule = pipeline::ScheduleKind::kZBH1;
  for (ShardingStrategy s : {ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams}) {
    c.data_parallel_sharding_strategy = s;
    EXPECT_TRUE(Finalize(&c, 4).ok()) << core::EnumName(s);
  }
  c = Base();
  c.tensor_model_parallel_size = 2;
  c.model.num_attention_heads = 3;
  c.model.hidden_size = 48;
  ExpectError(c, 2, {"--num-attention-heads (3)", "--tensor-model-parallel-size (2)"});
  c = Base();
  c.pipeline_model_parallel_size = 2;
  c.num_layers_per_virtual_pipeline_stage = 1;
  c.global_batch_size = 12;
  c.micro_batch_size = 4;  // 3 micro-batches, not a multiple of PP 2
  ExpectError(c, 2, {"micro-batches per step (3", "--pipeline-model-parallel-size (2)"});
  c = Base();
  c.save_interval = 10;
  ExpectError(c, 1, {"--save-interval needs --save"});
  c = Base();
  c.hidden_dropout = 1.5f;
  ExpectError(c, 1, {"--hidden-dropout (1.5)"});
  c = Base();
  c.optimizer.bucket_bytes = 0;
  ExpectError(c, 1, {"--ddp-bucket-size (0)"});
  c = Base();
  c.overlap_param_gather = true;
  ExpectError(c, 1, {"--overlap-param-gather needs --use-distributed-optimizer"});
}

TEST(ConfigTest, ExpertParallelWithContextParallel) {
  TrainConfig c = Base();
  c.model.num_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.add_bias_linear = false;
  c.context_parallel_size = 2;
  c.expert_model_parallel_size = 2;
  c.global_batch_size = 8;
  c.micro_batch_size = 2;
  absl::Status s = Finalize(&c, 4);  // DP 2 x CP 2, EP 2 within DP
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.data_parallel_size, 2);
  c.expert_model_parallel_size = 4;  // EP is carved out of DP, not DP x CP
  ExpectError(c, 4, {"--expert-model-parallel-size (4)", "data-parallel size (2)"});
  c.expert_model_parallel_size = 2;
  c.model.moe_expert_capacity_factor = 1.0f;  // each CP rank would drop from its own share
  ExpectError(c, 4, {"--moe-expert-capacity-factor", "--context-parallel-size"});
}

TEST(ConfigTest, TimerAndProfileFlags) {
  TrainConfig c = Base();
  EXPECT_EQ(c.timing_log_level, 0);  // Megatron's default
  EXPECT_FALSE(c.profile);
  c.timing_log_level = 3;
  ExpectError(c, 1, {"--timing-log-level=3", "expected 0"});
  c = Base();
  c.timing_log_level = -1;
  ExpectError(c, 1, {"--timing-log-level=-1"});
  c = Base();
  c.log_timers_to_tensorboard = true;
  ExpectError(c, 1, {"--log-timers-to-tensorboard needs --tensorboard-dir"});
  c = Base();
  c.profile = true;
  ExpectError(c, 1, {"--profile needs --profile-dir"});
  c.profile_dir = "/tmp/p";
  c.profile_step_start = 5;
  c.profile_step_end = 5;
  ExpectError(c, 1, {"--profile-step-end (5) must be > --profile-step-start (5)"});
  c.profile_step_start = -1;
  ExpectError(c, 1, {"--profile-step-start=-1"});
  c.profile_step_start = 10;
  c.profile_step_end = 12;
  c.train_iters = 10;
  ExpectError(c, 1, {"--profile-step-start (10) must be < --train-iters (10)"});
  c.train_iters = 11;
  EXPECT_TRUE(Finalize(&c, 1).ok());
  c = Base();
  c.timing_log_level = 2;
  c.profile_step_end = 0;  // ignored without --profile
  EXPECT_TRUE(Finalize(&c, 1).ok());
}

TEST(ConfigTest, TensorBoardFlags) {
  TrainConfig c = Base();
  c.tensorboard_log_interval = 0;
  ExpectError(c, 1, {"--tensorboard-log-interval (0) must be >= 1"});
  c = Base();
  c.log_memory_to_tensorboard = true;
  ExpectError(c, 1, {"--log-memory-to-tensorboard needs --tensorboard-dir"});
  c = Base();
  c.log_validation_ppl_to_tensorboard = true;
  ExpectError(c, 1, {"--log-validation-ppl-to-tensorboard needs --tensorboard-dir"});
  c.tensorboard_dir = "runs";
  c.log_memory_to_tensorboard = true;
  EXPECT_TRUE(Finalize(&c, 1).ok());
}

TEST(ConfigTest, RejectsLlamaFlagsThatCannotWork) {
  TrainConfig c = Base();  // 4 heads
  c.model.group_query_attention = true;
  c.model.num_query_groups = 2;
  c.tensor_model_parallel_size = 4;
  ExpectError(c, 4, {"--num-query-groups (2)", "is not divisible by",
                     "--tensor-model-parallel-size (4)"});
  c = Base();
  c.model.group_query_attention = true;
  c.model.num_query_groups = 3;
  ExpectError(c, 1, {"--num-attention-heads (4)", "is not divisible by", "--num-query-groups (3)"});
  // The whole Llama-style set is accepted, with TP splitting the groups.
  c = Base();
  c.model.normalization = layers::Normalization::kRMSNorm;
  c.model.position_embedding_type = layers::PositionEmbedding::kRope;
  c.model.swiglu = true;
  c.model.group_query_attention = true;
  c.model.num_query_groups = 2;
  c.model.untie_embeddings_and_output_weights = true;
  c.model.add_bias_linear = false;
  c.tensor_model_parallel_size = 2;
  c.sequence_parallel = true;
  c.pipeline_model_parallel_size = 2;
  EXPECT_TRUE(Finalize(&c, 4).ok());
}

TEST(ConfigTest, DefaultsAreTheDefaultJob) {
  TrainConfig c;  // what `bazel run //train:gpt` runs with no flags (2 ranks)
  ASSERT_TRUE(Finalize(&c, 2).ok());
  EXPECT_EQ(c.train_iters, 700);
  EXPECT_EQ(c.data_parallel_size, 2);
  EXPECT_EQ(c.num_micro_batches, 1);
  EXPECT_EQ(c.lr.warmup_iters, 20);
  EXPECT_EQ(c.lr.decay_iters, 700);
  EXPECT_EQ(c.distributed_backend, "ucx");
}

TEST(ConfigTest, BackendIsCheckedByTheFlagTyped) {
  TrainConfig c = Base();
  c.distributed_backend = "carrier-pigeon";
  ExpectError(c, 2,
              {"--distributed-backend=carrier-pigeon", "expected one of local, mpi, nccl, ucx"});
  c.distributed_backend_flag = "--backend";
  ExpectError(c, 2, {"--backend=carrier-pigeon"});
  c = Base();
  c.distributed_backend = "nccl";
  ExpectError(c, 1, {"--distributed-backend=nccl needs --device=cuda"});
  c = Base();
  c.device = DeviceKind::kCuda;
  ASSERT_TRUE(Finalize(&c, 1).ok());
  EXPECT_EQ(c.distributed_backend, "nccl");
  c = Base();
  c.distributed_timeout_s = -60;
  ExpectError(c, 1, {"--distributed-timeout-minutes"});
}

}  // namespace
}  // namespace loom::train

// Megatron's exit flags and LOOM_FAULT are checked before any work.
namespace loom::train {
namespace {

TEST(ConfigTest, ExitFlagsAndFaultInjection) {
  TrainConfig c = Base();
  c.exit_signal_handler = true;
  ExpectError(c, 1, {"--exit-signal-handler needs --save=<directory>"});
  c.save = "/tmp/ckpt";
  EXPECT_TRUE(Finalize(&c, 1).ok());
  for (int64_t bad : {0, -3}) {
    c = Base();
    c.exit_interval = bad;
    ExpectError(c, 1, {"--exit-interval (" + std::to_string(bad) + ") must be >= 1"});
  }
  c = Base();
  c.exit_interval = 100;  // without --save: stops without saving (Megatron's too)
  EXPECT_TRUE(Finalize(&c, 1).ok());
  for (double bad : {0.0, -1.0}) {
    c = Base();
    c.exit_duration_in_mins = bad;
    ExpectError(c, 1, {"--exit-duration-in-mins (", ") must be > 0"});
  }
  c = Base();
  c.exit_duration_in_mins = 0.5;
  EXPECT_TRUE(Finalize(&c, 1).ok());

  c = Base();
  c.fault_injection = "rank=1,iteration=5,kind=boom";
  ExpectError(c, 2, {"LOOM_FAULT=rank=1,iteration=5,kind=boom", "unknown kind=boom"});
  c.fault_injection = "rank=2,iteration=5,kind=exit";
  ExpectError(c, 2, {"LOOM_FAULT=", "rank=2 is outside the world of 2 ranks"});
  c.fault_injection = "rank=1,iteration=5,kind=sigkill";
  EXPECT_TRUE(Finalize(&c, 2).ok());
}

// Megatron's --data-parallel-sharding-strategy; --use-distributed-optimizer
// is `optim`. DP 1 is accepted as in Megatron (nothing to shard). A misspelt
// strategy never reaches Finalize: its flag's parser refuses it (the
// message below; gpt_flags_test: as the command line reports it, exit 2).
TEST(ShardingStrategyTest, ParsesMegatronsNamesAndRefusesTheRest) {
  using S = ShardingStrategy;
  struct Case {
    S strategy;
    bool use_distributed_optimizer, distributed, shard_gradients;
  };
  for (const Case& k : {Case{S::kUnset, false, false, false}, Case{S::kUnset, true, true, false},
                        Case{S::kNoShard, false, false, false}, Case{S::kOptim, false, true, false},
                        Case{S::kOptim, true, true, false}, Case{S::kOptimGrads, false, true, true},
                        Case{S::kOptimGrads, true, true, true}}) {
    for (const int world : {1, 2}) {
      TrainConfig c = Base();
      c.data_parallel_sharding_strategy = k.strategy;
      c.optimizer.distributed = k.use_distributed_optimizer;
      absl::Status s = Finalize(&c, world);
      ASSERT_TRUE(s.ok()) << core::EnumName(k.strategy) << ": " << s;
      EXPECT_EQ(c.optimizer.distributed, k.distributed) << core::EnumName(k.strategy);
      EXPECT_EQ(c.optimizer.shard_gradients, k.shard_gradients) << core::EnumName(k.strategy);
    }
  }
  // The flag's parser: Megatron's four spellings, exactly (case included).
  for (const char* name : {"no_shard", "optim", "optim_grads", "optim_grads_params"}) {
    S parsed = S::kUnset;
    std::string error;
    EXPECT_TRUE(AbslParseFlag(name, &parsed, &error)) << name;
    EXPECT_EQ(core::EnumName(parsed), name);
  }
  for (const char* bad : {"foo", "Optim", "zero3"}) {
    S parsed = S::kOptim;
    std::string error;
    EXPECT_FALSE(AbslParseFlag(bad, &parsed, &error)) << bad;
    EXPECT_EQ(error, "expected one of \"\" | no_shard | optim | optim_grads | optim_grads_params");
    EXPECT_EQ(parsed, S::kOptim) << bad;  // untouched
  }
  TrainConfig c = Base();
  c.data_parallel_sharding_strategy = S::kNoShard;
  c.optimizer.distributed = true;
  ExpectError(c, 2, {"--use-distributed-optimizer", "--data-parallel-sharding-strategy=no_shard"});
  c = Base();
  c.data_parallel_sharding_strategy = S::kOptimGradsParams;  // ZeRO-3: all three sharded
  ASSERT_TRUE(Finalize(&c, 2).ok());
  EXPECT_TRUE(c.optimizer.distributed && c.optimizer.shard_gradients && c.optimizer.shard_params);
}

}  // namespace
}  // namespace loom::train
