#include "train/test_util.h"

#include <memory>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "comm/testing/host_staged_communicator.h"
#include "comm/testing/ranks_as_threads.h"
#include "gtest/gtest.h"
#include "train/data/indexed_dataset.h"

namespace loom::train::testing {

std::string Layout::Describe() const {
  return absl::StrCat("TP", tp, " PP", pp, cp > 1 ? absl::StrCat(" CP", cp) : "", " DP", dp,
                      ep > 1 ? absl::StrCat(" EP", ep) : "",
                      vp_layers ? " vp-layers 1" : "",
                      sp ? " SP" : "",
                      shard_params  ? " optim_grads_params"
                      : shard_grads ? " optim_grads"
                      : distributed ? " dist-opt"
                                    : "",
                      overlap ? " overlap" : "",
                      param_gather ? " param-gather" : "", " ",
                      schedule);
}

Layout OptimGrads(Layout l) {
  l.distributed = true;
  l.shard_grads = true;
  return l;
}

Layout OptimGradsParams(Layout l) {
  l = OptimGrads(l);
  l.shard_params = true;
  return l;
}

std::string Dataset() {
  static std::once_flag once;
  static std::string prefix;
  std::call_once(once, [] {
    prefix = std::string(getenv("TEST_TMPDIR")) + "/corpus";
    auto w = train::IndexedDatasetWriter::Create(prefix, train::TokenType::kU16);
    std::mt19937 rng(5);
    for (int doc = 0; doc < 200; ++doc) {
      std::vector<int32_t> t(20 + rng() % 40);
      const int base = 'a' + rng() % 20;
      for (size_t i = 0; i < t.size(); ++i) t[i] = (rng() % 8 == 0) ? ' ' : base + (i % 5);
      (void)(*w)->AddSequence(t.data(), t.size());
      (void)(*w)->EndDocument();
    }
    (void)(*w)->Finalize();
  });
  return prefix;
}

train::TrainConfig TinyConfig(const Layout& l, int64_t train_iters) {
  train::TrainConfig c;
  c.model.num_layers = 4;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 16;
  c.model.make_vocab_size_divisible_by = 8;
  c.tensor_model_parallel_size = l.tp;
  c.pipeline_model_parallel_size = l.pp;
  c.num_layers_per_virtual_pipeline_stage = l.vp_layers;
  c.pipeline_schedule = pipeline::ParseScheduleKind(l.schedule).value();
  c.sequence_parallel = l.sp;
  c.context_parallel_size = l.cp;
  c.expert_model_parallel_size = l.ep;
  c.optimizer.distributed = l.distributed;
  c.optimizer.shard_gradients = l.shard_grads;
  c.optimizer.shard_params = l.shard_params;
  c.overlap_grad_reduce = l.overlap;
  c.overlap_param_gather = l.param_gather;
  c.optimizer.bucket_bytes = 16 << 10;  // a bucket a layer: the overlap has work to do
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.train_iters = train_iters;
  c.lr.lr = 3e-3f;
  c.lr.min_lr = 3e-4f;
  c.lr.warmup_iters = 2;
  c.hidden_dropout = 0.1f;
  c.data_path = Dataset();
  c.data_cache_dir = getenv("TEST_TMPDIR");
  c.eval_interval = 0;
  c.eval_iters = 0;
  c.log_interval = 1000;
  c.peak_flops = 1e9;  // skip the start-up GEMM measurement
  return c;
}

train::TrainConfig TinyLlamaConfig(const Layout& l, int64_t train_iters) {
  train::TrainConfig c = TinyConfig(l, train_iters);
  c.model.normalization = layers::Normalization::kRMSNorm;
  c.model.layernorm_epsilon = 1e-6f;
  c.model.position_embedding_type = layers::PositionEmbedding::kRope;
  c.model.swiglu = true;  // ffn: int(4 x 32 x 2/3 / 64) x 64 = 64
  c.model.group_query_attention = true;
  c.model.num_query_groups = 2;
  c.model.untie_embeddings_and_output_weights = true;
  c.model.add_bias_linear = false;
  return c;
}

RunResult Run(const train::TrainConfig& config, const Layout& l, TrainerHook after_create,
              TrainerHook after_train, LogHook on_log) {
  RunResult result;
  const int world = l.world();
  train::TrainConfig c = config;
  result.status = train::Finalize(&c, world);
  if (!result.status.ok()) return result;
  auto run = [&](int r, comm::Communicator* host) -> absl::Status {
    // A device run's collectives move device memory, as NCCL's do: staged
    // through the host (so a host tensor handed to them is refused).
    std::unique_ptr<comm::Communicator> staged;
    if (!c.model.device.is_cpu()) {
      staged = std::make_unique<comm::testing::HostStagedCommunicator>(host, c.model.device);
    }
    comm::Communicator* comm = staged ? staged.get() : host;
    auto t = train::Trainer::Create(c, comm, [&result, &on_log, r](const std::string& line) {
      if (r != 0) return;
      result.log.push_back(line);
      if (on_log) on_log(line);
    });
    if (!t.ok()) return t.status();
    if (after_create) after_create(r, **t);
    absl::Status s = (*t)->Train();
    if (r == 0 && s.ok()) {
      result.losses = (*t)->losses();
      result.eval_loss = (*t)->last_eval_loss();
    }
    if (s.ok() && after_train) after_train(r, **t);
    return s;
  };
  // By rank, not by time: rank 0's error when it has one (it may name a peer's).
  result.status = comm::testing::RunRanksAsThreadsEach(world, run).lowest;
  return result;
}

void ExpectSameCurve(const std::vector<double>& got, const std::vector<double>& ref, size_t first,
                     double relative_tolerance, const std::string& what) {
  ASSERT_EQ(got.size() + first, ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], ref[first + i], relative_tolerance * ref[first + i])
        << what << ", iteration " << first + i + 1;
  }
}

Curve TrainCurve(const train::TrainConfig& config, const Layout& layout) {
  Curve curve;
  RunResult r = Run(config, layout, nullptr, [&curve](int rank, train::Trainer& t) {
    absl::StatusOr<double> norm = t.optimizer().GradNorm();
    EXPECT_TRUE(norm.ok()) << norm.status();
    if (rank == 0 && norm.ok()) curve.grad_norm = *norm;
  });
  EXPECT_TRUE(r.status.ok()) << layout.Describe() << ": " << r.status;
  curve.losses = r.losses;
  curve.eval_loss = r.eval_loss;
  return curve;
}

void ExpectSameCurveAndNorm(const Curve& got, const Curve& want, double relative_tolerance,
                            const std::string& what) {
  ExpectSameCurve(got.losses, want.losses, 0, relative_tolerance, what);
  EXPECT_NEAR(got.grad_norm, want.grad_norm, relative_tolerance * want.grad_norm) << what;
}

}  // namespace loom::train::testing
