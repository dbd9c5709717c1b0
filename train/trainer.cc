#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/file_util.h"
#include "checkpoint/format.h"
#include "checkpoint/reader.h"
#include "comm/launch/heartbeat.h"
#include "comm/launch/launcher.h"
#include "core/enum_names.h"
#include "core/ops/ops.h"
#include "core/status_macros.h"
#include "layers/context_parallel.h"
#include "layers/vocab_parallel.h"
#include "models/gpt/gpt_model.h"  // the GPT family's StageModel, created in Setup
#include "pipeline/layer_assignment.h"
#include "train/data/packing.h"
#include "train/data/sft_data.h"
#include "train/default_data.h"
#include "train/exit_signal.h"

namespace loom::train {

using comm::launch::Beat;
using comm::launch::Phase;
using core::Shape;
using core::Tensor;

namespace {

// "loom: data: --data-path=0.3 data/a 0.7 data/b: 1200 training and 40 validation samples of
// 128 tokens (blend indices read from the cache)": what the run reads, before it reads it.
std::string DescribeData(const DataSplitsOptions& o, bool default_corpus,
                         const BlendedDataset* train, const BlendedDataset* valid) {
  std::string from = default_corpus ? "the default corpus"
                     : !o.data_path.empty()
                         ? absl::StrCat("--data-path=", o.data_path)
                         : absl::StrCat("--train-data-path=", o.train_data_path,
                                        " --valid-data-path=", o.valid_data_path);
  const bool blend = train != nullptr && train->num_datasets() > 1;
  return absl::StrCat("loom: data: ", from, ": ", train ? train->num_samples() : 0,
                      " training and ", valid ? valid->num_samples() : 0, " validation samples of ",
                      o.seq_length, " tokens",
                      blend ? (train->indices_loaded_from_cache()
                                   ? " (blend indices read from the cache)"
                                   : " (blend indices built)")
                            : "");
}

// Megatron's packed-document switches with the tokenizer's EOD id.
PackingOptions PackingOf(const TrainConfig& c, int32_t eod) {
  return {eod, c.reset_position_ids, c.reset_attention_mask, c.eod_mask_loss};
}

// A dropout stream id from (iteration, first global sample of the
// micro-batch): the same for every parallel layout.
uint64_t StreamId(int64_t iteration, int64_t first_sample, bool training) {
  uint64_t z = static_cast<uint64_t>(iteration) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(first_sample) * 0xC2B2AE3D27D4EB4Full ^ (training ? 0 : 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 27);
}

// "\n" + each of Megatron's timer lines ("" when none): appended to the log
// line they belong to, one record.
std::string TimerBlock(const std::vector<TimerMinMax>& times) {
  std::string block;
  for (const std::string& line : Timers::Format(times)) absl::StrAppend(&block, "\n", line);
  return block;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         comm::Communicator* world, LogFn log) {
  LOOM_ASSIGN_OR_RETURN(comm::Grid grid,
                        comm::Grid::Make(world->size(),
                                         comm::GridDegrees{config.tensor_model_parallel_size,
                                                           config.pipeline_model_parallel_size,
                                                           config.context_parallel_size}));
  std::unique_ptr<Trainer> t(new Trainer(config, world, grid, std::move(log)));
  core::LedgerScope memory(t->memory_);  // this rank's ledger (core/memory_stats.h)
  LOOM_RETURN_IF_ERROR(t->Setup());
  return t;
}

void Trainer::Log(const std::string& line) const {
  if (world_->rank() != 0) return;
  if (log_) {
    log_(line);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

absl::Status Trainer::Setup() {
  Beat(iteration_, Phase::kSetup);
  // First, so a SIGTERM during the setup is remembered, not fatal.
  if (config_.exit_signal_handler) InstallExitSignalHandler();
  const int restart = comm::launch::RestartCount();
  LOOM_ASSIGN_OR_RETURN(faults_, FaultInjector::Create(config_.fault_injection, world_->rank(),
                                                       restart));
  coord_ = grid_.Coord(world_->rank());
  if (config_.profile) {
    profile::ProfileOptions po;
    po.dir = config_.profile_dir;
    po.step_start = config_.profile_step_start;
    po.step_end = config_.profile_step_end;
    LOOM_ASSIGN_OR_RETURN(profiler_, profile::Profiler::Create(po, world_->rank()));
    timers_.set_profiler(profiler_.get());
  }
  LOOM_ASSIGN_OR_RETURN(groups_, comm::MakeParallelGroups(*world_, grid_));
  if (const int ep = config_.expert_model_parallel_size; ep > 1) {
    // EP ranks are consecutive DP ranks (Megatron's layout) at the same CP
    // rank: each group is named by its first member's global rank. The
    // expert-data-parallel group holds the same experts: the DP / EP
    // replicas and, under CP, every CP rank of each (DP / EP x CP ranks, in
    // global rank order).
    comm::GridCoord first = coord_;
    first.dp_rank = coord_.dp_rank / ep * ep;
    LOOM_ASSIGN_OR_RETURN(ep_, world_->Split(grid_.GlobalRank(first), coord_.dp_rank % ep, "ep"));
    first.dp_rank = coord_.dp_rank % ep;
    first.cp_rank = 0;
    LOOM_ASSIGN_OR_RETURN(
        expert_dp_, world_->Split(grid_.GlobalRank(first),
                                  coord_.dp_rank / ep * grid_.cp() + coord_.cp_rank, "expert_dp"));
  }
  LOOM_RETURN_IF_ERROR(SetupData());  // fixes the vocabulary size

  const int pp = grid_.pp(), vp = config_.virtual_pipeline_size;
  pipeline::ScheduleOptions so;
  so.kind = config_.pipeline_schedule;
  so.pp = pp;
  so.vp = vp;
  so.micro_batches = static_cast<int>(config_.num_micro_batches);
  // The chunks' layers where the schedule places them: Megatron's interleaving, or the V of
  // zbv and dualpipev (stage r: virtual stages r and 2P-1-r, so stage 0 holds both ends).
  std::vector<layers::ChunkSpec> chunks;
  for (int c = 0; c < vp; ++c) {
    LOOM_ASSIGN_OR_RETURN(pipeline::LayerRange r, pipeline::ChunkLayers(so, config_.model.num_layers,
                                                                        coord_.pp_rank, c));
    const int vs = pipeline::VirtualStageOf(so, coord_.pp_rank, c);
    chunks.push_back(layers::ChunkSpec{r.first, r.count, vs == 0, vs == pp * vp - 1});
  }
  layers::TpGroup tp{groups_.tp.get(), config_.sequence_parallel};
  tp.comm_overlap = config_.tp_comm_overlap;  // --tp-comm-overlap: the ring (layers/tp_overlap.h)
  layers::CpGroup cp{groups_.cp.get()};
  {
    // The GPT family's factory. The executor, the gradient sync and the
    // timers below see only a layers::StageModel: a new model family
    // provides another StageModel here.
    core::MemoryScope tag(core::MemoryCategory::kParameters);
    layers::GptConfig model_config = config_.model;
    // ZeRO-2: GradientSync owns the gradient storage (no full-size buffer).
    model_config.allocate_gradients = !config_.optimizer.shard_gradients;
    // ZeRO-3: GradientSync owns the parameter storage too (the owned shard).
    model_config.allocate_parameters = !config_.optimizer.shard_params;
    LOOM_ASSIGN_OR_RETURN(model_, layers::GptModel::Create(
                                      model_config, tp, cp, chunks,
                                      /*buffer_multiple=*/GradientGroup()->size(),
                                      layers::EpGroup{ep_.get()}));
  }
  // The model allocates its gradient buffer next to the parameters.
  if (model_->params().flat_grads().defined()) {
    model_->params().flat_grads().storage()->set_memory_category(core::MemoryCategory::kGradients);
  }

  LOOM_ASSIGN_OR_RETURN(pipeline::Schedule schedule, pipeline::BuildSchedule(so));
  pipeline::ExecutorOptions eo;
  eo.micro_batch_size = config_.micro_batch_size;
  eo.loss_scale = 1.0f / static_cast<float>(config_.num_micro_batches);
  // Per-action timers only when logged (level 2) or profiled: else no call at all.
  if (config_.timing_log_level >= 2 || profiler_) eo.observer = &executor_timers_;
  // The executors' point-to-point traffic shares the pp group with its
  // collectives (the loss broadcast, the gradient norm): collectives match
  // by their place among the group's collectives alone (comm/comm.h).
  LOOM_ASSIGN_OR_RETURN(pipeline::Executor executor,
                        pipeline::Executor::Create(schedule, model_.get(), groups_.pp.get(), eo));
  executor_.emplace(std::move(executor));
  // Evaluation runs forwards only, in the training schedule's forward order.
  LOOM_ASSIGN_OR_RETURN(pipeline::Schedule eval_schedule, pipeline::BuildForwardOnlySchedule(so));
  pipeline::ExecutorOptions eval_options = eo;
  eval_options.forward_only = true;
  eval_options.observer = nullptr;  // the timers are the training steps
  LOOM_ASSIGN_OR_RETURN(pipeline::Executor eval_executor,
                        pipeline::Executor::Create(eval_schedule, model_.get(), groups_.pp.get(),
                                                   eval_options));
  eval_executor_.emplace(std::move(eval_executor));

  // The gradients between the backward and the optimizer: one owner.
  distributed::GradientSyncGroups gg;
  gg.dp = GradientGroup();
  gg.expert_dp = expert_dp_.get();
  gg.expert_parallel = config_.expert_model_parallel_size;
  // The V keeps both ends of the tied embedding on stage 0: nothing to sum across stages.
  gg.embedding = pipeline::IsVShape(so.kind) ? nullptr : groups_.embedding.get();
  distributed::GradientSyncOptions go;
  go.micro_batches = config_.num_micro_batches;
  go.bucket_bytes = config_.optimizer.bucket_bytes;
  go.overlap_grad_reduce = config_.overlap_grad_reduce;
  go.distributed_optimizer = config_.optimizer.distributed;
  go.shard_gradients = config_.optimizer.shard_gradients;
  go.shard_params = config_.optimizer.shard_params;
  go.overlap_param_gather = config_.overlap_param_gather;
  go.instances = config_.num_distributed_optimizer_instances;  // hybrid sharding
  {
    core::MemoryScope tag(core::MemoryCategory::kGradients);
    LOOM_ASSIGN_OR_RETURN(gradients_, distributed::GradientSync::Create(model_.get(), gg, go));
  }
  if (profiler_) {
    // Per-layer spans: an observer of the model's units, added after
    // GradientSync so that its spans nest inside GradientSync's waits.
    executor_timers_.set_head_unit(model_->head_unit());
    model_->AddObserver(&executor_timers_);
  }
  OptimizerGroups og;
  og.tp = groups_.tp.get();
  og.pp = groups_.pp.get();
  og.shards = config_.optimizer.distributed ? gradients_->shard_group() : nullptr;
  og.experts = ep_.get();
  {
    core::MemoryScope tag(core::MemoryCategory::kOptimizer);
    LOOM_ASSIGN_OR_RETURN(optimizer_, Optimizer::Create(&model_->params(), config_.optimizer, og,
                                                        gradients_->owned(),
                                                        gradients_->owned_grads(),
                                                        gradients_->owned_values()));
  }

  Beat(iteration_, Phase::kSetup);
  std::optional<int64_t> restart_from;  // a restart resuming from --save
  if (config_.load.empty() && !config_.save.empty() && restart > 0) {
    LOOM_ASSIGN_OR_RETURN(restart_from, RestartCheckpoint(restart));
  }
  if (!config_.load.empty() || restart_from.has_value()) {
    Beat(iteration_, Phase::kSave);
    if (restart_from.has_value()) {
      LOOM_RETURN_IF_ERROR(LoadCheckpoint(config_.save, restart_from, restart));
      last_saved_iteration_ = iteration_;  // it is in --save already
    } else {
      LOOM_RETURN_IF_ERROR(LoadCheckpoint(config_.load, config_.checkpoint.load_iteration, 0));
    }
    LOOM_RETURN_IF_ERROR(model_->params().SyncComputeCopy());  // bf16 weights from the loaded f32
    Beat(iteration_, Phase::kSetup);
  }
  if (!config_.save.empty()) {
    checkpoint::SaveOptions so;
    so.dir = config_.save;
    so.keep_last = config_.checkpoint.keep_last;
    so.async = config_.checkpoint.async_save;
    so.save_optimizer = config_.checkpoint.save_optim;
    LOOM_ASSIGN_OR_RETURN(checkpointer_, checkpoint::Checkpointer::Create(world_, so));
  }

  if (world_->rank() == 0) {
    LOOM_ASSIGN_OR_RETURN(metrics_, MetricsFile::Open(config_.metrics_file));
    if (!config_.tensorboard_dir.empty()) {
      auto tb = tensorboard::EventWriter::Open(config_.tensorboard_dir);
      if (!tb.ok()) {
        return absl::Status(tb.status().code(), absl::StrCat("--tensorboard-dir=",
                                                             config_.tensorboard_dir, ": ",
                                                             tb.status().message()));
      }
      tensorboard_ = std::move(*tb);
    }
  }
  // Every rank measures its GEMM rate at the same moment, so each sees its
  // share of the machine (the MFU denominator).
  LOOM_RETURN_IF_ERROR(world_->Barrier()->Wait());
  if (config_.peak_flops > 0) {
    peak_flops_ = config_.peak_flops;
  } else {
    LOOM_ASSIGN_OR_RETURN(peak_flops_,
                          MeasureGemmFlops(config_.model.device, config_.model.compute_dtype));
  }

  const layers::GptConfig& m = config_.model;
  std::string variant;  // what differs from GPT-2
  if (m.rms_norm()) variant += ", RMSNorm";
  if (m.rope()) variant += ", RoPE";
  if (m.swiglu) absl::StrAppend(&variant, ", SwiGLU (ffn ", m.ffn(), ")");
  if (m.query_groups() != m.num_attention_heads) {
    absl::StrAppend(&variant, ", ", m.query_groups(), " query groups");
  }
  if (!m.tied_output_layer()) variant += ", untied output layer";
  if (!m.add_bias_linear) variant += m.add_qkv_bias ? ", only a QKV bias" : ", no linear biases";
  if (m.moe()) {
    absl::StrAppend(&variant, ", MoE: ", m.num_experts, " experts, top-", m.moe_router_topk,
                    m.moe_layer_freq == 1 ? " in every layer"
                                          : absl::StrCat(" every ", m.moe_layer_freq, " layers"),
                    m.moe_expert_capacity_factor > 0
                        ? absl::StrCat(", capacity factor ", m.moe_expert_capacity_factor)
                        : std::string(", dropless"),
                    " (", layers::ActiveParameterCount(m) / 1e6, "M active)");
  }
  Log(absl::StrFormat(
      "loom: GPT with %d layers, hidden %d, %d heads, seq %d, vocab %d (padded %d)%s: %.2fM "
      "parameters",
      m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, m.vocab_size,
      layers::PaddedVocabSize(m.vocab_size, m.make_vocab_size_divisible_by, grid_.tp()), variant,
      layers::ParameterCount(m) / 1e6));
  Log(absl::StrFormat(
      "loom: %d ranks = TP %d x PP %d x%s DP %d%s, schedule %s (vp %d), %d micro-batches of %d "
      "per step, global batch %d, backend %s, peak %.1f GFLOP/s per rank (%s)",
      world_->size(), grid_.tp(), grid_.pp(),
      grid_.cp() > 1 ? absl::StrFormat(" CP %d (ring attention) x", grid_.cp()) : "", grid_.dp(),
      config_.sequence_parallel ? " + SP" : "",
      pipeline::ScheduleKindName(config_.pipeline_schedule), vp,
      config_.num_micro_batches, config_.micro_batch_size, config_.global_batch_size,
      world_->backend_name(), peak_flops_ / 1e9,
      config_.peak_flops > 0
          ? std::string("--peak-flops")
          : absl::StrCat(GemmReferenceSize(config_.model.device), "^3 ",
                         core::DTypeName(config_.model.compute_dtype),
                         " GEMM measured at start")));
  if (ep_ != nullptr) {
    Log(absl::StrFormat(
        "loom: expert parallel: each MoE layer's %d experts split over EP %d (%d a rank), "
        "tokens exchanged by all-to-all-v; expert gradients averaged over %d replicas%s",
        config_.model.num_experts, ep_->size(), config_.model.num_experts / ep_->size(),
        expert_dp_->size(), grid_.cp() > 1 ? " (DP / EP x CP)" : ""));
  }
  if (GradientGroup()->size() > 1) {
    Log(absl::StrFormat(
        "loom: data-parallel gradients in %d buckets of <= %d parameters (--ddp-bucket-size): %s%s%s",
        gradients_->buckets().size(), config_.optimizer.bucket_bytes / 4,
        config_.optimizer.shard_params
            ? "ZeRO-3 reduce-scatter in every micro-batch's backward (only the owned gradient "
              "and parameter shards kept; each unit's parameters all-gathered before its forward "
              "and backward)"
        : config_.optimizer.shard_gradients
            ? "ZeRO-2 reduce-scatter in every micro-batch's backward (only the owned gradient "
              "shard kept)"
        : config_.optimizer.distributed ? "ZeRO-1 reduce-scatter"
                                        : "all-reduce",
        config_.overlap_grad_reduce         ? " overlapped with the backward"
        : config_.optimizer.shard_gradients ? " waited for as each bucket completes"
                                            : " after the backward",
        !config_.optimizer.distributed ? ""
        : config_.optimizer.shard_params
            ? (config_.overlap_param_gather ? ", the next unit's gather prefetched behind each unit"
                                            : ", each unit's gather waited for when it starts")
        : config_.overlap_param_gather ? ", parameter all-gather overlapped with the next forward"
                                       : ", parameter all-gather after the step"));
  }
  if (const int n = config_.num_distributed_optimizer_instances; n > 1) {
    const int per = GradientGroup()->size() / n;
    Log(absl::StrFormat(
        "loom: hybrid sharding (--num-distributed-optimizer-instances %d): the %d data-parallel "
        "ranks%s in %d instances of %d consecutive ones (instance i: ranks i x %d .. i x %d + %d); "
        "sharded within an instance%s, each bucket's shard all-reduced across the %d instances "
        "once the instance has reduced it%s",
        n, GradientGroup()->size(), grid_.cp() > 1 ? " (DP x CP)" : "", n, per, per, per,
        per - 1, ep_ != nullptr ? " (the experts over the instance's share of their replicas)" : "",
        n,
        config_.overlap_grad_reduce || config_.optimizer.shard_gradients ? " (behind the backward)"
                                                                        : " (after the backward)"));
  }
  // From here on the peaks are the training's, not the setup's transients
  // (the GEMM measurement, a checkpoint read).
  memory_->ResetPeak();
  return absl::OkStatus();
}

absl::Status Trainer::SetupData() {
  LOOM_ASSIGN_OR_RETURN(tokenizer_, MakeTokenizer(config_.tokenizer_type,
                                                  {config_.vocab_file, config_.merge_file,
                                                   config_.tokenizer_model}));
  config_.model.vocab_size = tokenizer_->vocab_size();
  if (PackingOf(config_, -1).any() && tokenizer_->eod_id() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_.reset_attention_mask ? "--reset-attention-mask"
        : config_.reset_position_ids ? "--reset-position-ids"
                                     : "--eod-mask-loss",
        " finds documents by the end-of-document token, and --tokenizer-type=",
        core::EnumName(config_.tokenizer_type),
        " here has none (GPT-2: <|endoftext|>; Hugging Face: eos_token)"));
  }
  const std::string cache = config_.data_cache_dir.empty()
                                ? absl::StrCat(getenv("HOME") ? getenv("HOME") : "/tmp",
                                               "/.cache/loom")
                                : config_.data_cache_dir;
  // --data-path (a corpus or Megatron's blend, split by --split), or a blend
  // per split (--train-data-path, --valid-data-path); train/data/blend.h.
  DataSplitsOptions o;
  o.data_path = config_.data_path;
  o.train_data_path = config_.train_data_path;
  o.valid_data_path = config_.valid_data_path;
  o.split = config_.split;
  o.seq_length = config_.model.seq_length;
  o.seed = config_.model.seed;
  o.cache_dir = cache;
  // --skip-train (or --train-iters=0) evaluates only: no train split needed,
  // so a validation-only corpus (--split=0,100,0) scores an imported model.
  if (!config_.skip_train && config_.train_iters > 0) {
    o.train_samples = config_.train_iters * config_.global_batch_size;
  }
  if (config_.eval_iters > 0) o.valid_samples = config_.eval_iters * config_.global_batch_size;
  const bool default_corpus = o.data_path.empty() && o.train_data_path.empty() &&
                              o.valid_data_path.empty();
  // Rank 0 prepares (the default or mock corpus, the sample and blend
  // indices) first; the others then read what it cached.
  for (int pass = 0; pass < 2; ++pass) {
    const bool mine = (pass == 0) == (world_->rank() == 0);
    if (mine) {
      if (default_corpus && o.data_path.empty()) {
        if (config_.mock_data) {
          LOOM_ASSIGN_OR_RETURN(o.data_path, PrepareMockData(cache, config_.model.vocab_size));
        } else {
          const std::string name(core::EnumName(config_.tokenizer_type));
          LOOM_ASSIGN_OR_RETURN(o.data_path, PrepareDefaultData(cache, *tokenizer_, name));
        }
      }
      LOOM_ASSIGN_OR_RETURN(DataSplits data, BuildDataSplits(o));
      if (config_.sft) {
        LOOM_ASSIGN_OR_RETURN(DataSplits masks, BuildLossMaskSplits(o, data));
        mask_corpora_ = std::move(masks.corpora);
        train_mask_ = std::move(masks.train);
        valid_mask_ = std::move(masks.valid);
      }
      corpora_ = std::move(data.corpora);
      train_data_ = std::move(data.train);
      valid_data_ = std::move(data.valid);
      Log(DescribeData(o, default_corpus, train_data_.get(), valid_data_.get()));
      if (train_data_ == nullptr && o.train_samples > 0) {
        return absl::InvalidArgumentError("no training data: give --data-path or --train-data-path");
      }
    }
    // Rank 0's preprocessing (tokenizing the default corpus, building sample
    // indices) may outlast --comm-timeout-s: this barrier has its own limit.
    LOOM_RETURN_IF_ERROR(world_->BarrierWithin(absl::Hours(2))->Wait());
  }
  return absl::OkStatus();
}

absl::StatusOr<pipeline::MicroBatch> Trainer::MakeMicroBatch(const BlendedDataset& data,
                                                             int64_t consumed, int m,
                                                             bool training) const {
  // This rank's rows of the sequence: all of it, or under context
  // parallelism its two chunks, read alone (layers/context_parallel.h).
  const int64_t s = model_->local_seq_length(), b = config_.micro_batch_size;
  const layers::CpGroup cp{groups_.cp.get()};
  const std::vector<layers::RowRun> runs =
      layers::GlobalRowRuns(cp.Layout(config_.model.seq_length), 0, s);
  pipeline::MicroBatch mb;
  LOOM_ASSIGN_OR_RETURN(mb.ids, Tensor::Empty(Shape{s, b}, core::DType::kI32));
  LOOM_ASSIGN_OR_RETURN(mb.targets, Tensor::Empty(Shape{s, b}, core::DType::kI32));
  std::vector<int32_t> tokens(s + 1);
  // Packed documents (train/data/packing.h): the tables cover the whole
  // sample, so a CP rank reads all of it, not only its two chunks.
  const PackingOptions packing = PackingOf(config_, tokenizer_->eod_id());
  const int64_t seq = config_.model.seq_length;
  std::shared_ptr<layers::PackedDocuments> documents;
  std::vector<int32_t> sample, sft_mask;
  // --sft: the loss mask's samples match the ids' sample for sample.
  const BlendedDataset* mask_data =
      !config_.sft ? nullptr : &data == train_data_.get() ? train_mask_.get() : valid_mask_.get();
  if (config_.sft && mask_data == nullptr) {
    return absl::InternalError("--sft: no loss mask for this split");
  }
  if (packing.any() || mask_data != nullptr) {
    documents = std::make_shared<layers::PackedDocuments>();
    documents->seq_len = seq;
    documents->batch = b;
    sample.resize(seq + 1);
    if (mask_data != nullptr) sft_mask.resize(seq + 1);
  }
  for (int64_t j = 0; j < b; ++j) {
    const int64_t index = SampleIndexFor(consumed, m, b, coord_.dp_rank, grid_.dp(), j);
    if (documents != nullptr) {
      LOOM_RETURN_IF_ERROR(
          data.SampleTokens(index % data.num_samples(), 0, seq + 1, sample.data()));
      const SampleMasks masks = LtorMasksAndPositionIds(sample.data(), seq, packing);
      auto append = [](const auto& from, auto* to) {
        to->insert(to->end(), from.begin(), from.end());
      };
      if (packing.reset_position_ids) append(masks.position, &documents->position);
      if (packing.reset_attention_mask) append(masks.doc_start, &documents->doc_start);
      if (packing.eod_mask_loss) append(masks.loss_mask, &documents->loss_weight);
      if (mask_data != nullptr) {
        // The mask of target i (token i + 1), times --eod-mask-loss's when on.
        LOOM_RETURN_IF_ERROR(mask_data->SampleTokens(index % mask_data->num_samples(), 0,
                                                     seq + 1, sft_mask.data()));
        if (!packing.eod_mask_loss) documents->loss_weight.resize((j + 1) * seq, 1.0f);
        for (int64_t i = 0; i < seq; ++i) {
          documents->loss_weight[j * seq + i] *= static_cast<float>(sft_mask[i + 1]);
        }
      }
    }
    for (const layers::RowRun& run : runs) {
      // Inputs [g, g + n) and their targets [g + 1, g + n + 1).
      if (documents != nullptr) {
        std::copy_n(sample.begin() + run.global_first, run.count + 1, tokens.begin());
      } else {
        LOOM_RETURN_IF_ERROR(data.SampleTokens(index % data.num_samples(), run.global_first,
                                               run.count + 1, tokens.data()));
      }
      for (int64_t i = 0; i < run.count; ++i) {  // [s, b]: sequence first
        mb.ids.data<int32_t>()[(run.local_first + i) * b + j] = tokens[i];
        mb.targets.data<int32_t>()[(run.local_first + i) * b + j] = tokens[i + 1];
      }
      // Device kernels cannot report a bad id: check here, on the host.
      for (int64_t i = 0; i <= run.count; ++i) {
        if (tokens[i] < 0 || tokens[i] >= config_.model.vocab_size) {
          return absl::OutOfRangeError(absl::StrCat(
              "sample ", index, " of the dataset holds token id ", tokens[i],
              ", outside the tokenizer's vocabulary [0, ", config_.model.vocab_size,
              "): was --data-path preprocessed with this --tokenizer-type?"));
        }
      }
    }
  }
  if (!config_.model.device.is_cpu()) {
    LOOM_ASSIGN_OR_RETURN(mb.ids, mb.ids.To(config_.model.device));
    LOOM_ASSIGN_OR_RETURN(mb.targets, mb.targets.To(config_.model.device));
  }
  mb.dropout.hidden_p = config_.hidden_dropout;
  mb.dropout.attention_p = config_.attention_dropout;
  mb.dropout.seed = config_.model.seed;
  mb.dropout.training = training;
  mb.dropout.stream =
      StreamId(iteration_, SampleIndexFor(consumed, m, b, coord_.dp_rank, grid_.dp(), 0), training);
  if (documents != nullptr && (packing.eod_mask_loss || mask_data != nullptr)) {
    // Megatron's masked mean over the micro-batch, sum(mask · loss) /
    // sum(mask), as the model's mean over s·b tokens of weighted losses.
    std::vector<float>& w = documents->loss_weight;
    double kept = 0;
    for (float x : w) kept += x;
    for (float& x : w) x = kept > 0 ? static_cast<float>(x * w.size() / kept) : 0.0f;
  }
  mb.dropout.documents = std::move(documents);
  return mb;
}

absl::StatusOr<double> Trainer::TrainStep() {
  // 1. Forward and backward of every micro-batch, as the pipeline schedule
  //    says; the model's unit events start data-parallel buckets as their last
  //    backward runs (--overlap-grad-reduce), and each forward waits for the
  //    parameters it reads (--overlap-param-gather).
  // The fault first: a rank that hangs here has not beaten for this step,
  // while the ranks that wait for it have (the agent names the oldest beat).
  LOOM_RETURN_IF_ERROR(faults_.AtStep(iteration_ + 1, world_));  // LOOM_FAULT (tests only)
  Beat(iteration_, Phase::kTrain);
  core::LedgerScope memory(memory_);
  LOOM_RETURN_IF_ERROR(gradients_->StartStep());
  const int64_t consumed = consumed_samples_;
  std::optional<core::MemoryScope> tag(std::in_place, core::MemoryCategory::kActivations);
  timers_.Start(TimerId::kForwardBackward);
  straggler_.Start();  // --log-straggler's compute: forward-backward + optimizer
  faults_.InCompute(iteration_ + 1);  // LOOM_FAULT kind=slow (tests only): a slow GPU
  LOOM_ASSIGN_OR_RETURN(pipeline::StepResult step, executor_->RunStep([&](int m) {
    Beat(iteration_, Phase::kTrain);  // three relaxed stores: every micro-batch
    timers_.Start(TimerId::kBatchGenerator);
    absl::StatusOr<pipeline::MicroBatch> mb =
        MakeMicroBatch(*train_data_, consumed, m, /*training=*/true);
    timers_.Stop(TimerId::kBatchGenerator,
                 timers_.profiling() ? absl::StrCat("{\"micro_batch\":", m, "}") : "");
    return mb;
  }));
  straggler_.Stop();
  timers_.Stop(TimerId::kForwardBackward);
  tag.reset();
  // 2. The gradients made final: DP, the tied embedding, SP (GradientSync).
  const TimerId grads = config_.optimizer.distributed ? TimerId::kGradsReduceScatter
                                                      : TimerId::kGradsAllReduce;
  timers_.Start(grads);
  LOOM_RETURN_IF_ERROR(gradients_->FinishGradients());
  timers_.Stop(grads);
  // 3. The loss of the global batch: the mean over the DP ranks' means (CP
  //    ranks' means over equal shares of the sequence: their mean is the
  //    sequence's).
  double loss = step.mean_loss;
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(GradientGroup(), comm::ReduceOp::kAvg, &loss));
  // 4. Clip by the global norm, AdamW on what this rank owns, then share the
  //    updated parameters (ZeRO-1).
  tag.emplace(core::MemoryCategory::kOptimizer);
  timers_.Start(TimerId::kOptimizer);
  straggler_.Start();
  LOOM_ASSIGN_OR_RETURN(double grad_norm, optimizer_->Step(config_.lr.At(iteration_)));
  straggler_.Stop();
  timers_.Stop(TimerId::kOptimizer);
  tag.reset();
  // ZeRO-1 only: otherwise nothing is gathered (Megatron's params-all-gather).
  if (config_.optimizer.distributed) timers_.Start(TimerId::kParamsAllGather);
  LOOM_RETURN_IF_ERROR(gradients_->StartParamGather());
  timers_.Stop(TimerId::kParamsAllGather);
  last_grad_norm_ = grad_norm;
  ++iteration_;
  consumed_samples_ += config_.global_batch_size;
  losses_.push_back(loss);
  return loss;
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (!valid_data_) return absl::FailedPreconditionError("no validation split (see --split)");
  core::LedgerScope memory(memory_);
  core::MemoryScope tag(core::MemoryCategory::kActivations);
  double total = 0;
  for (int64_t k = 0; k < config_.eval_iters; ++k) {
    Beat(iteration_, Phase::kEval);
    LOOM_ASSIGN_OR_RETURN(pipeline::StepResult step, eval_executor_->RunStep([&](int m) {
      Beat(iteration_, Phase::kEval);
      return MakeMicroBatch(*valid_data_, k * config_.global_batch_size, m, /*training=*/false);
    }));
    double loss = step.mean_loss;
    LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(GradientGroup(), comm::ReduceOp::kAvg, &loss));
    total += loss;
  }
  // ZeRO-3: the last unit's gather, kept as a guess for a next pass, is freed.
  LOOM_RETURN_IF_ERROR(gradients_->FinishParamGather());
  return total / std::max<int64_t>(1, config_.eval_iters);
}

core::MemoryStats Trainer::RankMemory() const {
  const core::Device device = config_.model.device;
  core::MemoryStats s = memory_->Stats(device.type);
  if (!device.is_cpu()) {
    if (const core::Allocator* a = core::GetAllocator(device.type); a != nullptr) {
      std::optional<core::MemoryStats> d = a->DeviceMemoryStats(device);
      if (d.has_value()) s.reserved = d->reserved;
    }
  }
  return s;
}

absl::StatusOr<int64_t> Trainer::MaxMemoryPeak() {
  double peak = static_cast<double>(RankMemory().total_peak);
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(world_, comm::ReduceOp::kMax, &peak));
  return static_cast<int64_t>(peak);
}

namespace {

// What shrinks each category (--memory-report), largest first: " memory:
// activations (48% of the peak) grow with ...".
std::vector<std::string> MemoryHints(const TrainConfig& c, const comm::Grid& g,
                                     const core::MemoryStats& s) {
  using C = core::MemoryCategory;
  struct Hint {
    int64_t bytes;
    const char* name;
    std::string text;
  };
  std::vector<Hint> hints;
  // What the strategy shards is sharded over the ranks that share the
  // gradients, DP (x CP), or one of --num-distributed-optimizer-instances'
  // instances of them.
  const int instances = c.num_distributed_optimizer_instances;
  const int shards = g.dp() * g.cp() / instances;
  hints.push_back({s.peak_of(C::kParameters) + s.peak_of(C::kGradients), "parameters + gradients",
                   c.optimizer.shard_params
                       ? absl::StrFormat("--data-parallel-sharding-strategy=optim_grads_params "
                                         "keeps 1/%d of the f32 parameters and gradients plus "
                                         "the bucket buffers of the unit running (its gathered "
                                         "parameters are communication); "
                                         "--tensor-model-parallel-size and "
                                         "--pipeline-model-parallel-size divide them (now TP %d "
                                         "x PP %d)",
                                         shards, g.tp(), g.pp())
                   : c.optimizer.shard_gradients
                       ? absl::StrFormat("%d B per parameter of this rank (f32 master%s), and "
                                         "--data-parallel-sharding-strategy=optim_grads keeps "
                                         "1/%d of the f32 gradients plus bucket buffers; "
                                         "--tensor-model-parallel-size and "
                                         "--pipeline-model-parallel-size divide them (now TP %d "
                                         "x PP %d)",
                                         c.bf16 ? 6 : 4, c.bf16 ? ", bf16 compute copy" : "",
                                         shards, g.tp(), g.pp())
                       : absl::StrFormat("%d B per parameter of this rank (f32 master and "
                                         "gradient%s); --tensor-model-parallel-size and "
                                         "--pipeline-model-parallel-size divide them (now TP %d "
                                         "x PP %d)",
                                         c.bf16 ? 10 : 8, c.bf16 ? ", bf16 compute copy" : "",
                                         g.tp(), g.pp())});
  std::string over = g.cp() > 1 ? absl::StrFormat("DP x CP %d", g.dp() * g.cp())
                                : absl::StrFormat("DP %d", g.dp());
  if (instances > 1) {
    over = absl::StrFormat("the %d ranks of an instance (%s / --num-distributed-optimizer-instances "
                           "%d)", shards, over, instances);
  }
  hints.push_back(
      {s.peak_of(C::kOptimizer), "optimizer",
       c.optimizer.distributed
           ? absl::StrFormat("Adam's two f32 moments, already sharded over %s "
                             "(--use-distributed-optimizer)",
                             over)
       : shards > 1 ? absl::StrFormat("Adam's two f32 moments, 8 B per parameter; "
                                      "--use-distributed-optimizer would divide them by %s",
                                      over)
                    : std::string("Adam's two f32 moments, 8 B per parameter; with DP > 1, "
                                  "--use-distributed-optimizer shards them over DP")});
  const std::string tp_part =
      g.tp() == 1           ? "TP divides the attention and MLP ones (with --sequence-parallel, "
                              "the rest too)"
      : c.sequence_parallel ? "TP with --sequence-parallel divides them"
                            : "--sequence-parallel would divide the norm and dropout ones by TP "
                              "too";
  hints.push_back({s.peak_of(C::kActivations), "activations",
                   absl::StrFormat("grow with --micro-batch-size (%d), --seq-length (%d) and the "
                                   "micro-batches a pipeline stage keeps in flight (up to PP "
                                   "with 1f1b); %s; %s; --recompute-granularity trades them "
                                   "for compute",
                                   c.micro_batch_size, c.model.seq_length, tp_part,
                                   g.cp() > 1
                                       ? absl::StrFormat("--context-parallel-size divides all "
                                                         "of them (now CP %d)",
                                                         g.cp())
                                       : std::string("--context-parallel-size would divide all "
                                                     "of them (long sequences)"))});
  hints.push_back({s.peak_of(C::kCommunication), "communication",
                   "the collectives' staging buffers, kept for reuse; --ddp-bucket-size bounds "
                   "the data-parallel reductions' share"});
  std::stable_sort(hints.begin(), hints.end(),
                   [](const Hint& a, const Hint& b) { return a.bytes > b.bytes; });
  const double total = std::max<double>(1, static_cast<double>(s.total_peak));
  std::vector<std::string> lines;
  for (const Hint& h : hints) {
    if (h.bytes <= 0) continue;
    lines.push_back(absl::StrFormat(" memory: %s (%.0f%% of the peak): %s", h.name,
                                    100.0 * h.bytes / total, h.text));
  }
  return lines;
}

}  // namespace

absl::Status Trainer::ReportMemory() {
  // Every rank's figures, gathered to rank 0: current[6], peak[6], the
  // totals and the reserved bytes (exact in a double up to 2^53 bytes).
  constexpr int kCats = core::kNumMemoryCategories, kFields = 2 * kCats + 3;
  const int world = world_->size();
  const core::MemoryStats mine = RankMemory();
  LOOM_ASSIGN_OR_RETURN(Tensor in, Tensor::Empty(Shape{kFields}, core::DType::kF64));
  double* v = in.data<double>();
  for (int c = 0; c < kCats; ++c) {
    v[c] = static_cast<double>(mine.current[c]);
    v[kCats + c] = static_cast<double>(mine.peak[c]);
  }
  v[2 * kCats] = static_cast<double>(mine.total_current);
  v[2 * kCats + 1] = static_cast<double>(mine.total_peak);
  v[2 * kCats + 2] = static_cast<double>(mine.reserved);
  Tensor all = in;
  if (world > 1) {
    LOOM_ASSIGN_OR_RETURN(all, Tensor::Empty(Shape{kFields * world}, core::DType::kF64));
    LOOM_RETURN_IF_ERROR(comm::AllGatherHost(world_, in, all));
  }
  if (world_->rank() != 0) return absl::OkStatus();
  std::vector<core::MemoryStats> ranks(world);
  core::MemoryStats max;
  for (int r = 0; r < world; ++r) {
    const double* f = all.data<double>() + r * kFields;
    core::MemoryStats& s = ranks[r];
    for (int c = 0; c < kCats; ++c) {
      s.current[c] = static_cast<int64_t>(f[c]);
      s.peak[c] = static_cast<int64_t>(f[kCats + c]);
      max.current[c] = std::max(max.current[c], s.current[c]);
      max.peak[c] = std::max(max.peak[c], s.peak[c]);
    }
    s.total_current = static_cast<int64_t>(f[2 * kCats]);
    s.total_peak = static_cast<int64_t>(f[2 * kCats + 1]);
    s.reserved = static_cast<int64_t>(f[2 * kCats + 2]);
    max.total_current = std::max(max.total_current, s.total_current);
    max.total_peak = std::max(max.total_peak, s.total_peak);
    max.reserved = std::max(max.reserved, s.reserved);
  }
  const core::Device device = config_.model.device;
  Log(absl::StrFormat(
      " memory after iteration %d (--memory-report): peak bytes per rank since the setup, of the "
      "tensors on %s%s",
      iteration_, device.is_cpu() ? "the CPU" : "the rank's GPU",
      device.is_cpu() ? "" : "; reserved: the caching allocator's cudaMalloc'd bytes"));
  constexpr int kRanksListed = 16;  // beyond: rank 0 and the largest of each figure
  for (int r = 0; r < world && (world <= kRanksListed || r == 0); ++r) {
    const comm::GridCoord at = grid_.Coord(r);
    Log(FormatMemory(absl::StrFormat(" memory (rank %d: TP %d, PP %d,%s DP %d, peak)", r,
                                     at.tp_rank, at.pp_rank,
                                     grid_.cp() > 1 ? absl::StrFormat(" CP %d,", at.cp_rank) : "",
                                     at.dp_rank),
                     ranks[r]));
  }
  if (world > 1) {
    Log(FormatMemory(absl::StrFormat(" memory (largest over %d ranks, peak)", world), max));
  }
  if (config_.optimizer.shard_params) {
    // ZeRO-3's gathered units are transient communication memory: their share of it.
    Log(absl::StrFormat(
        " memory communication/gather (ZeRO-3, this step's peak on rank 0): %.2f MiB of whole "
        "parameters gathered at once (a unit's buckets%s); parameters at rest: the owned shard",
        static_cast<double>(gradients_->peak_gathered_bytes()) / (1 << 20),
        config_.overlap_param_gather ? " and the prefetched neighbour's" : ""));
  }
  if (!device.is_cpu()) {
    // The allocator's own view of rank 0's device: block bytes, every user.
    const core::Allocator* a = core::GetAllocator(device.type);
    if (std::optional<core::MemoryStats> d = a ? a->DeviceMemoryStats(device) : std::nullopt) {
      Log(FormatMemory(absl::StrCat(" memory (", device.ToString(),
                                    " allocator blocks, peak since start)"),
                       *d));
    }
  }
  for (const std::string& line : MemoryHints(config_, grid_, max)) Log(line);
  return absl::OkStatus();
}

absl::Status Trainer::EnsureHostMirror() {
  if (config_.model.device.is_cpu() || host_params_) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(layers::ParamBuffer mirror, model_->params().HostMirror());
  host_params_ = std::make_unique<layers::ParamBuffer>(std::move(mirror));
  LOOM_ASSIGN_OR_RETURN(host_exp_avg_,
                        Tensor::Zeros(optimizer_->exp_avg().shape(), core::DType::kF32));
  LOOM_ASSIGN_OR_RETURN(host_exp_avg_sq_,
                        Tensor::Zeros(optimizer_->exp_avg_sq().shape(), core::DType::kF32));
  if (const Tensor owned = gradients_->owned_values(); owned.defined()) {  // ZeRO-3
    LOOM_ASSIGN_OR_RETURN(host_owned_values_, Tensor::Zeros(owned.shape(), core::DType::kF32));
  }
  return absl::OkStatus();
}

absl::Status Trainer::StageToHost() {
  LOOM_RETURN_IF_ERROR(EnsureHostMirror());
  if (!host_params_) return absl::OkStatus();
  if (host_owned_values_.defined()) {  // ZeRO-3: the model holds no values, the shard does
    LOOM_RETURN_IF_ERROR(core::ops::Copy(gradients_->owned_values(), &host_owned_values_));
  } else {
    Tensor values = host_params_->flat_values();  // a handle: the copy fills the mirror
    LOOM_RETURN_IF_ERROR(core::ops::Copy(model_->params().flat_values(), &values));
  }
  LOOM_RETURN_IF_ERROR(core::ops::Copy(optimizer_->exp_avg(), &host_exp_avg_));
  return core::ops::Copy(optimizer_->exp_avg_sq(), &host_exp_avg_sq_);
}

absl::Status Trainer::UnstageFromHost() {
  if (!host_params_) return absl::OkStatus();
  if (host_owned_values_.defined()) {
    LOOM_RETURN_IF_ERROR(
        core::ops::Copy(host_owned_values_, gradients_->mutable_owned_values()));
  } else {
    Tensor values = model_->params().flat_values();
    LOOM_RETURN_IF_ERROR(core::ops::Copy(host_params_->flat_values(), &values));
  }
  LOOM_RETURN_IF_ERROR(core::ops::Copy(host_exp_avg_, &optimizer_->mutable_exp_avg()));
  return core::ops::Copy(host_exp_avg_sq_, &optimizer_->mutable_exp_avg_sq());
}

checkpoint::RankView Trainer::CheckpointView() {
  checkpoint::RankView v;
  v.model = config_.model;
  v.params = host_params_ ? host_params_.get() : &model_->params();
  v.exp_avg = host_params_ ? &host_exp_avg_ : &optimizer_->mutable_exp_avg();
  v.exp_avg_sq = host_params_ ? &host_exp_avg_sq_ : &optimizer_->mutable_exp_avg_sq();
  v.moment_ranges = optimizer_->owned();
  v.values = host_owned_values_.defined() ? &host_owned_values_
                                          : gradients_->mutable_owned_values();  // ZeRO-3
  v.tp_rank = coord_.tp_rank;
  v.dp_rank = GradientGroup()->rank();  // CP ranks hold the same parameters: DP x CP rank
  v.expert_dp_rank = expert_dp_ ? expert_dp_->rank() : v.dp_rank;
  v.pp_rank = coord_.pp_rank;
  v.distributed_optimizer = config_.optimizer.distributed;
  return v;
}

absl::Status Trainer::SaveCheckpoint() {
  if (!checkpointer_) return absl::FailedPreconditionError("SaveCheckpoint needs --save");
  core::LedgerScope memory(memory_);
  checkpoint::Manifest h;
  h.set_created_by("loom //train:gpt");
  checkpoint::TrainingState* t = h.mutable_training();
  t->set_iteration(iteration_);
  t->set_consumed_samples(consumed_samples_);
  t->set_optimizer_step(optimizer_->step_count());
  t->set_lr(config_.lr.lr);
  t->set_min_lr(config_.lr.min_lr);
  t->set_lr_decay_style(std::string(core::EnumName(config_.lr.style)));
  t->set_lr_warmup_iters(config_.lr.warmup_iters);
  t->set_lr_decay_iters(config_.lr.decay_iters);
  t->set_train_iters(config_.train_iters);
  t->set_global_batch_size(config_.global_batch_size);
  checkpoint::Layout* l = h.mutable_layout();
  l->set_tensor_parallel(grid_.tp());
  l->set_pipeline_parallel(grid_.pp());
  l->set_data_parallel(grid_.dp());
  l->set_virtual_pipeline(config_.virtual_pipeline_size);
  l->set_sequence_parallel(config_.sequence_parallel);
  l->set_schedule(pipeline::ScheduleKindName(config_.pipeline_schedule));
  l->set_distributed_optimizer(config_.optimizer.distributed);
  l->set_world_size(world_->size());
  *h.mutable_model() = checkpoint::ModelConfigProto(config_.model);
  Beat(iteration_, Phase::kSave);
  timers_.Start(TimerId::kSaveCheckpoint);
  LOOM_RETURN_IF_ERROR(gradients_->FinishParamGather());  // --overlap-param-gather
  LOOM_RETURN_IF_ERROR(StageToHost());
  faults_.BeforeSave(iteration_);  // LOOM_FAULT kind=save (tests only)
  checkpoint::RankView view = CheckpointView();
  if (gradients_->instance() > 0) {
    // Hybrid sharding: instance 0's ranks write the sharded values and
    // moments, each element once; the other instances hold replicas of them.
    view.exp_avg = view.exp_avg_sq = view.values = nullptr;
  }
  LOOM_RETURN_IF_ERROR(checkpointer_->Save(view, h));
  timers_.Stop(TimerId::kSaveCheckpoint,
               timers_.profiling() ? absl::StrCat("{\"iteration\":", iteration_, "}") : "");
  // Megatron logs save-checkpoint (level 0) after every save: with the
  // save's line here, one record.
  LOOM_ASSIGN_OR_RETURN(std::vector<TimerMinMax> times,
                        timers_.MinMaxAcrossRanks(world_, {TimerId::kSaveCheckpoint}, 1, true));
  Beat(iteration_, Phase::kSave);
  last_saved_iteration_ = iteration_;
  Log(absl::StrFormat(" saved checkpoint at iteration %d to %s%s (blocked %.3f s)", iteration_,
                      config_.save, config_.checkpoint.async_save ? " (async)" : "",
                      checkpointer_->last_stall_seconds()) +
      TimerBlock(times));
  return absl::OkStatus();
}

absl::Status Trainer::WaitForCheckpoint() {
  if (!checkpointer_) return absl::OkStatus();
  Beat(iteration_, Phase::kSave);
  absl::Status s = checkpointer_->Wait();
  Beat(iteration_, Phase::kSave);
  return s;
}

absl::Status Trainer::LoadCheckpoint(const std::string& dir, std::optional<int64_t> iteration,
                                     int restart) {
  // A restart resumes the run exactly: never --finetune's fresh start.
  const bool finetune = restart == 0 && config_.checkpoint.finetune;
  // --skip-train takes no step: the Adam moments are not needed either.
  const bool want_optim =
      (restart > 0 || config_.checkpoint.load_optim) && !finetune && !config_.skip_train;
  LOOM_RETURN_IF_ERROR(EnsureHostMirror());
  LOOM_ASSIGN_OR_RETURN(checkpoint::Manifest m,
                        checkpoint::LoadCheckpoint(world_, dir, iteration, CheckpointView(),
                                                   want_optim));
  if (want_optim && !m.training().has_optimizer_state()) {
    // Every rank reads the same manifest: every rank fails the same way.
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s (iteration %d) has no optimizer state (saved with --no-save-optim, or "
        "imported): to train from its weights starting at iteration 0 pass --finetune; to "
        "resume at iteration %d with fresh Adam moments pass --no-load-optim",
        dir, m.training().iteration(), m.training().iteration()));
  }
  LOOM_RETURN_IF_ERROR(UnstageFromHost());
  if (finetune) {
    set_position(0, 0);  // fresh LR schedule, data position and dropout streams
    Log(absl::StrFormat(
        " loaded the weights of checkpoint %s (iteration %d; saved as TP %d x PP %d x DP %d) for "
        "--finetune: starting at iteration 0 with fresh optimizer state",
        dir, m.training().iteration(), m.layout().tensor_parallel(),
        m.layout().pipeline_parallel(), m.layout().data_parallel()));
    return absl::OkStatus();
  }
  set_position(m.training().iteration(), m.training().consumed_samples());
  const bool optim = want_optim && m.training().has_optimizer_state();
  if (optim) optimizer_->set_step_count(m.training().optimizer_step());
  if (restart > 0) {
    Log(absl::StrFormat("restart %d: resuming from %s iteration %d (%d samples consumed)",
                        restart, checkpoint::JoinPath(dir, checkpoint::IterDirName(iteration_)),
                        iteration_, consumed_samples_));
    return absl::OkStatus();
  }
  Log(absl::StrFormat(
      " loaded checkpoint from %s at iteration %d (%d samples consumed; saved as TP %d x PP %d x "
      "DP %d)%s",
      dir, iteration_, consumed_samples_, m.layout().tensor_parallel(),
      m.layout().pipeline_parallel(), m.layout().data_parallel(),
      optim || config_.skip_train ? "" : "; optimizer state not loaded (fresh Adam moments)"));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> Trainer::RestartCheckpoint(int restart) {
  // Rank 0 decides for all (one reading of `latest`), then tells the others.
  double found = -1;
  if (world_->rank() == 0) {
    const std::string& dir = config_.save;
    // Why `latest` is not this run's checkpoint to resume ("": it is).
    auto not_ours = [&](const std::string& path, const checkpoint::Manifest& m) -> std::string {
      const checkpoint::TrainingState& t = m.training();
      auto differs = [](const char* flag, auto saved, auto now) {
        return absl::StrCat(flag, " is ", now, " but was ", saved, " when it was saved");
      };
      if (t.train_iters() != config_.train_iters) {
        return differs("--train-iters", t.train_iters(), config_.train_iters);
      }
      if (t.global_batch_size() != config_.global_batch_size) {
        return differs("--global-batch-size", t.global_batch_size(), config_.global_batch_size);
      }
      if (t.lr() != config_.lr.lr || t.min_lr() != config_.lr.min_lr ||
          t.lr_decay_style() != core::EnumName(config_.lr.style) ||
          t.lr_warmup_iters() != config_.lr.warmup_iters ||
          t.lr_decay_iters() != config_.lr.decay_iters) {
        return "its learning-rate schedule differs from this run's";
      }
      if (t.iteration() > config_.train_iters) {
        return differs("the iteration", t.iteration(), config_.train_iters);
      }
      if (!t.has_optimizer_state()) {
        return "it has no optimizer state (--no-save-optim): it cannot be resumed exactly";
      }
      absl::Status model = checkpoint::CheckModelConfig(m.model(), config_.model, path);
      if (!model.ok()) return std::string(model.message());
      return "";
    };
    absl::StatusOr<std::string> path = checkpoint::ResolveCheckpoint(dir, std::nullopt);
    if (!path.ok()) {
      Log(absl::StrFormat("restart %d: no complete checkpoint in %s yet: starting from "
                          "iteration 0",
                          restart, dir));
    } else {
      const std::string file = checkpoint::JoinPath(*path, checkpoint::kManifestFile);
      absl::StatusOr<checkpoint::Manifest> m;
      absl::StatusOr<std::string> bytes = checkpoint::ReadFile(file);
      m = bytes.ok() ? checkpoint::DecodeManifest(*bytes, file) : bytes.status();
      const std::string why = m.ok() ? not_ours(*path, *m) : std::string(m.status().message());
      if (why.empty()) {
        found = static_cast<double>(m->training().iteration());
      } else {
        // Written by another run before this one saved anything (the first
        // start ignored it too), or unreadable: the first start's state.
        Log(absl::StrFormat("restart %d: not resuming from %s (%s): starting from iteration 0, "
                            "as the first start did",
                            restart, *path, why));
      }
    }
  }
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(world_, comm::ReduceOp::kMax, &found));
  if (found < 0) return std::optional<int64_t>();
  return std::optional<int64_t>(static_cast<int64_t>(found));
}

absl::StatusOr<Trainer::ExitReason> Trainer::AgreeOnExit() {
  if (config_.exit_interval.has_value() && iteration_ % *config_.exit_interval == 0) {
    return ExitReason::kInterval;  // the same on every rank: nothing to agree on
  }
  if (!config_.exit_signal_handler && !config_.exit_duration_in_mins.has_value()) {
    return ExitReason::kNone;
  }
  // A signal may reach some ranks only, and each rank has its own clock:
  // the ranks stop together if any says so (Megatron's all-reduce MAX).
  double vote = 0;
  if (config_.exit_duration_in_mins.has_value() &&
      std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count() >=
          *config_.exit_duration_in_mins * 60) {
    vote = 1;
  }
  if (config_.exit_signal_handler && ExitSignalReceived()) vote = 2;
  LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(world_, comm::ReduceOp::kMax, &vote));
  return vote == 2 ? ExitReason::kSignal : vote == 1 ? ExitReason::kDuration : ExitReason::kNone;
}

absl::Status Trainer::ExitEarly(ExitReason reason) {
  // --overlap-param-gather: the last step's gather would otherwise finish in
  // a forward that never comes (the parameters a caller reads, exports or
  // generates with must be whole).
  LOOM_RETURN_IF_ERROR(gradients_->FinishParamGather());
  std::string saved = "nothing saved (no --save)";
  if (checkpointer_) {
    if (last_saved_iteration_ != iteration_) LOOM_RETURN_IF_ERROR(SaveCheckpoint());
    LOOM_RETURN_IF_ERROR(WaitForCheckpoint());  // complete before anyone exits
    saved = "saved checkpoint";
  }
  exit_reason_ = reason;
  switch (reason) {
    case ExitReason::kSignal:
      Log(absl::StrFormat("exit signal handler: SIGTERM received at iteration %d; %s, exiting",
                          iteration_, saved));
      break;
    case ExitReason::kInterval:
      Log(absl::StrFormat("exit interval: iteration %d is a multiple of --exit-interval=%d; %s, "
                          "exiting",
                          iteration_, *config_.exit_interval, saved));
      break;
    case ExitReason::kDuration:
      Log(absl::StrFormat("exit duration: the run has taken %.2f minutes (--exit-duration-in-mins"
                          "=%g) at iteration %d; %s, exiting",
                          std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                        created_)
                                  .count() /
                              60,
                          *config_.exit_duration_in_mins, iteration_, saved));
      break;
    case ExitReason::kNone:
      break;
  }
  Beat(iteration_, Phase::kExiting);
  return absl::OkStatus();
}

absl::Status Trainer::RecordEval(double valid) {
  if (world_->rank() == 0) metrics_.WriteEval(iteration_, valid);
  if (!tensorboard_) return absl::OkStatus();
  AddTensorBoardScalar("lm loss validation", valid, true);
  if (config_.log_validation_ppl_to_tensorboard) {
    // Megatron caps the exponent at 20 (an untrained model's ppl is no number to plot).
    AddTensorBoardScalar("lm loss validation ppl", std::exp(std::min(20.0, valid)), true);
  }
  return tensorboard_->Flush();
}

void Trainer::AddTensorBoardScalar(const std::string& tag, double value, bool vs_samples) {
  const double now = tensorboard::WallTime();
  tensorboard_->AddScalar(tag, static_cast<float>(value), iteration_, now);
  if (vs_samples) {
    tensorboard_->AddScalar(tag + " vs samples", static_cast<float>(value), consumed_samples_, now);
  }
}

absl::Status Trainer::WriteTensorBoardStep(double loss) {
  AddTensorBoardScalar("learning-rate", config_.lr.At(iteration_ - 1), true);
  AddTensorBoardScalar("batch-size", config_.global_batch_size, true);
  AddTensorBoardScalar("lm loss", loss, true);
  AddTensorBoardScalar("grad-norm", last_grad_norm_, true);
  if (config_.log_memory_to_tensorboard) {
    // Megatron's torch.cuda names for Loom's figures since the setup: bytes
    // held now, their peak, the caching allocator's reserve (GPU only), and
    // the peak of each category (core/memory_stats.h).
    const core::MemoryStats mem = RankMemory();
    AddTensorBoardScalar("mem-allocated-bytes", mem.total_current, false);
    AddTensorBoardScalar("mem-max-allocated-bytes", mem.total_peak, false);
    if (mem.reserved > 0) AddTensorBoardScalar("mem-reserved-bytes", mem.reserved, false);
    for (int c = 0; c < core::kNumMemoryCategories; ++c) {
      AddTensorBoardScalar(
          absl::StrCat("mem-max-allocated-bytes/",
                       core::MemoryCategoryName(static_cast<core::MemoryCategory>(c))),
          mem.peak[c], false);
    }
  }
  return tensorboard_->Flush();
}

absl::StatusOr<std::string> Trainer::IntervalTimers(int64_t iterations) {
  const std::vector<TimerId> ids = timers_.IntervalTimers();
  if (ids.empty() || iterations < 1) return std::string();
  LOOM_ASSIGN_OR_RETURN(std::vector<TimerMinMax> times,
                        timers_.MinMaxAcrossRanks(world_, ids, static_cast<double>(iterations),
                                                  /*reset=*/true));
  if (tensorboard_ && config_.log_timers_to_tensorboard) {
    // Megatron's Timers.write: the max over ranks, seconds per iteration.
    for (const TimerMinMax& t : times) {
      AddTensorBoardScalar(absl::StrCat(TimerName(t.id), "-time"), t.max_ms / 1000, false);
    }
  }
  return TimerBlock(times);
}

absl::Status Trainer::CloseProfile() {
  if (!profiler_) return absl::OkStatus();
  return profiler_->Close(world_, [this](const std::string& line) { Log(line); });
}

absl::Status Trainer::Train() {
  core::LedgerScope memory(memory_);
  if (config_.skip_train) {
    // --skip-train: evaluate what was loaded; no step, nothing saved.
    if (!valid_data_) {
      return absl::FailedPreconditionError(
          "--skip-train evaluates on the validation split, which is empty: give it documents "
          "with --split (e.g. 969,30,1)");
    }
    const auto start = std::chrono::steady_clock::now();
    LOOM_ASSIGN_OR_RETURN(double valid, Evaluate());
    const double eval_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Log(absl::StrFormat(" validation loss at iteration %d: %.6f (perplexity %.2f, %d batches "
                        "in %.2f s; --skip-train: no training)",
                        iteration_, valid, std::exp(valid), config_.eval_iters, eval_s));
    LOOM_RETURN_IF_ERROR(RecordEval(valid));
    last_eval_loss_ = valid;
    return absl::OkStatus();
  }
  const auto log_fn = [this](const std::string& line) { Log(line); };
  const double tokens_per_step =
      static_cast<double>(config_.global_batch_size) * config_.model.seq_length;
  const double flops_per_token = ModelFlopsPerToken(config_.model);
  const auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  double window_paused_s = 0;  // evaluation and checkpoints inside the window
  int64_t window_iters = 0;
  double window_loss = 0;
  while (iteration_ < config_.train_iters) {
    double step_start_us = 0;
    if (profiler_) {
      LOOM_RETURN_IF_ERROR(profiler_->BeforeStep(iteration_, world_));
      step_start_us = profile::NowUs();
    }
    LOOM_ASSIGN_OR_RETURN(double loss, TrainStep());
    if (profiler_) {
      profiler_->AddSpan("train-step", "step", "main", step_start_us, profile::NowUs(),
                         absl::StrCat("{\"iteration\":", iteration_, "}"));
    }
    ++window_iters;
    window_loss += loss;
    if (tensorboard_ && iteration_ % config_.tensorboard_log_interval == 0) {
      LOOM_RETURN_IF_ERROR(WriteTensorBoardStep(loss));
    }
    const auto now = std::chrono::steady_clock::now();
    if (iteration_ % config_.log_interval == 0 || iteration_ == config_.train_iters) {
      const double window_s =
          std::chrono::duration<double>(now - window_start).count() - window_paused_s;
      StepMetrics m;
      m.iteration = iteration_;
      m.loss = window_loss / window_iters;
      m.lr = config_.lr.At(iteration_ - 1);
      m.grad_norm = last_grad_norm_;
      m.tokens_per_s = tokens_per_step * window_iters / window_s;
      m.model_tflops_per_rank = flops_per_token * m.tokens_per_s / world_->size() / 1e12;
      m.mfu = m.model_tflops_per_rank * 1e12 / peak_flops_;
      m.elapsed_s = std::chrono::duration<double>(now - start).count();
      m.eta_s = window_s / window_iters * (config_.train_iters - iteration_);
      m.memory = RankMemory();
      if (world_->size() > 1) {
        LOOM_ASSIGN_OR_RETURN(m.memory_peak_max, MaxMemoryPeak());
      }
      // Megatron's timer block belongs to the log line: one record.
      LOOM_ASSIGN_OR_RETURN(std::string timers, IntervalTimers(window_iters));
      Log(FormatStep(m, config_.train_iters) + timers);
      if (straggler_.enabled()) {  // collective: every rank, at every log line
        LOOM_ASSIGN_OR_RETURN(StragglerReport r,
                              straggler_.Report(world_, iteration_, window_iters));
        Log(FormatStragglerReport(r));
        if (tensorboard_) {
          AddTensorBoardScalar("straggler-slowdown", r.slowest.front().slowdown, false);
          AddTensorBoardScalar("straggler-median-compute-time", r.median_ms / 1000, false);
        }
      }
      if (world_->rank() == 0) metrics_.WriteStep(m);
      if (tensorboard_) {
        // Megatron's: seconds per iteration and model TFLOP/s per GPU, over the log interval.
        AddTensorBoardScalar("iteration-time", window_s / window_iters, false);
        AddTensorBoardScalar("throughput", m.model_tflops_per_rank, false);
        LOOM_RETURN_IF_ERROR(tensorboard_->Flush());
      }
      window_start = std::chrono::steady_clock::now();
      window_paused_s = 0;
      window_iters = 0;
      window_loss = 0;
    }
    const bool last = iteration_ == config_.train_iters;
    // Time outside training steps is kept out of tokens/s (the window's
    // iterations keep counting, so its length must exclude the pause).
    const auto pause_start = std::chrono::steady_clock::now();
    if (config_.memory_report && !memory_reported_) {
      LOOM_RETURN_IF_ERROR(ReportMemory());  // after the first step of the run
      memory_reported_ = true;
    }
    if (valid_data_ && config_.eval_interval > 0 &&
        (iteration_ % config_.eval_interval == 0 || last)) {
      const double eval_start_us = profiler_ ? profile::NowUs() : 0;
      LOOM_ASSIGN_OR_RETURN(double valid, Evaluate());
      if (profiler_) {
        profiler_->AddSpan("evaluate", "step", "main", eval_start_us, profile::NowUs(),
                           absl::StrCat("{\"eval_iters\":", config_.eval_iters, "}"));
      }
      const double eval_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - pause_start).count();
      Log(absl::StrFormat(" validation loss at iteration %d: %.4f (perplexity %.2f, %d batches "
                          "in %.2f s)",
                          iteration_, valid, std::exp(valid), config_.eval_iters, eval_s));
      LOOM_RETURN_IF_ERROR(RecordEval(valid));
      last_eval_loss_ = valid;
    }
    if (checkpointer_ && config_.save_interval > 0 && iteration_ % config_.save_interval == 0) {
      LOOM_RETURN_IF_ERROR(SaveCheckpoint());
    }
    // --exit-signal-handler, --exit-interval, --exit-duration-in-mins.
    // At the last iteration only a signal counts: the run is complete.
    LOOM_ASSIGN_OR_RETURN(ExitReason exit, AgreeOnExit());
    if (exit == ExitReason::kSignal || (exit != ExitReason::kNone && !last)) {
      LOOM_RETURN_IF_ERROR(ExitEarly(exit));
      return CloseProfile();
    }
    // After the step's log, evaluation and checkpoint: they are in the window
    // too (writing the traces is a pause, out of tokens/s).
    if (profiler_) LOOM_RETURN_IF_ERROR(profiler_->AfterStep(iteration_, world_, log_fn));
    window_paused_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - pause_start).count();
  }
  LOOM_RETURN_IF_ERROR(gradients_->FinishParamGather());  // as in ExitEarly
  if (checkpointer_ && last_saved_iteration_ != iteration_) LOOM_RETURN_IF_ERROR(SaveCheckpoint());
  LOOM_RETURN_IF_ERROR(WaitForCheckpoint());
  LOOM_RETURN_IF_ERROR(CloseProfile());
  Beat(iteration_, Phase::kExiting);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Trainer::Generate(const std::string& prompt, int64_t tokens) {
  if (grid_.pp() != 1) {
    return absl::FailedPreconditionError(
        "text generation needs --pipeline-model-parallel-size=1 (one rank holds every layer)");
  }
  const int64_t s = config_.model.seq_length;
  core::LedgerScope memory(memory_);
  core::MemoryScope tag(core::MemoryCategory::kActivations);
  std::vector<int32_t> ids = tokenizer_->Encode(prompt);
  if (ids.empty()) ids.push_back(tokenizer_->eod_id() >= 0 ? tokenizer_->eod_id() : 0);
  std::mt19937_64 rng(config_.model.seed);  // the same draws on every TP rank
  layers::DropoutStream no_dropout;
  no_dropout.training = false;
  const layers::CpGroup cp{groups_.cp.get()};
  std::vector<int32_t> out;
  for (int64_t n = 0; n < tokens; ++n) {
    Beat(iteration_, Phase::kExiting);  // after training: still alive
    // The last s tokens, right-padded: causal attention ignores the padding.
    // Under context parallelism each CP rank feeds its chunks, and the one
    // holding position len - 1 samples the next token for all of them.
    const int64_t len = std::min<int64_t>(s, ids.size());
    const int64_t local = model_->local_seq_length();
    LOOM_ASSIGN_OR_RETURN(Tensor window, Tensor::Zeros(Shape{local, 1}, core::DType::kI32));
    int64_t last_row = -1;  // this rank's row of position len - 1, if it has it
    for (const layers::RowRun& run : layers::GlobalRowRuns(cp.Layout(s), 0, local)) {
      for (int64_t i = 0; i < run.count; ++i) {
        const int64_t pos = run.global_first + i;
        if (pos < len) window.data<int32_t>()[run.local_first + i] = ids[ids.size() - len + pos];
        if (pos == len - 1) last_row = run.local_first + i;
      }
    }
    const std::unique_ptr<layers::StageModel::Activations> saved = model_->NewActivations();
    double unused = 0;
    if (!config_.model.device.is_cpu()) {
      LOOM_ASSIGN_OR_RETURN(window, window.To(config_.model.device));
    }
    LOOM_RETURN_IF_ERROR(
        model_->Forward(0, window, window, no_dropout, saved.get(), &unused).status());
    LOOM_ASSIGN_OR_RETURN(Tensor logits, model_->GatherLogits(*saved));  // [local, 1, V]
    const double u01 = std::uniform_real_distribution<double>(0, 1)(rng);  // every rank draws
    double next_id = 0;
    if (last_row >= 0) {
      const int64_t v = logits.dim(2);
      const float* row = logits.data<float>() + last_row * v;
      std::vector<double> p(v);
      double max = -1e300, sum = 0;
      for (int64_t k = 0; k < v; ++k) max = std::max(max, double(row[k]));
      for (int64_t k = 0; k < v; ++k) sum += p[k] = std::exp((row[k] - max) / 0.8);
      double u = u01 * sum;
      int64_t next = 0;
      while (next + 1 < v && u > p[next]) u -= p[next++];
      next_id = static_cast<double>(next);
    }
    if (cp.parallel()) {  // the owner's id; the others add 0
      LOOM_RETURN_IF_ERROR(comm::AllReduceScalar(groups_.cp.get(), comm::ReduceOp::kSum, &next_id));
    }
    const int32_t next = static_cast<int32_t>(next_id);
    ids.push_back(static_cast<int32_t>(next));
    out.push_back(static_cast<int32_t>(next));
  }
  // End-of-document tokens become blank lines (the byte tokenizer's is NUL).
  std::string text;
  std::vector<int32_t> piece;
  for (int32_t id : out) {
    if (id == tokenizer_->eod_id()) {
      text += tokenizer_->Decode(piece) + "\n\n";
      piece.clear();
    } else {
      piece.push_back(id);
    }
  }
  return text + tokenizer_->Decode(piece);
}

}  // namespace loom::train
