#include "core/cuda/vocab_parallel_ce.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/check.h"
#include "core/cuda/check_args.h"
#include "core/cuda/kernels.h"

namespace loom::core::cuda {
namespace {

// Checks logits (dtype here, shapes by the shared contract) and the shard;
// returns the number of rows.
absl::StatusOr<int64_t> CheckShard(const char* op, const Tensor& logits,
                                   const cpu::VocabShard& shard) {
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(op, "logits", logits));
  LOOM_ASSIGN_OR_RETURN(const int64_t n,
                        ops::CheckVocabShardRows(op, logits, /*targets=*/Tensor(), shard));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(op, "rows", n));
  return n;
}

}  // namespace

absl::Status VocabShardRowMax(const Tensor& logits, const cpu::VocabShard& shard, Tensor* max) {
  constexpr const char* kOp = "VocabShardRowMax";
  LOOM_ASSIGN_OR_RETURN(const int64_t n, CheckShard(kOp, logits, shard));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "max", max, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "max", *max, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"logits", &logits}, {"max", max}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::VocabRowMax(internal::ElemOf(logits.dtype()), logits.raw_data(),
                                             n, logits.dim(logits.rank() - 1), shard.valid,
                                             max->data<float>(), stream));
  return absl::OkStatus();
}

absl::Status VocabShardSumExp(const Tensor& logits, const Tensor& targets, const Tensor& max,
                              const cpu::VocabShard& shard, Tensor* sums) {
  constexpr const char* kOp = "VocabShardSumExp";
  LOOM_ASSIGN_OR_RETURN(const int64_t n, CheckShard(kOp, logits, shard));
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "targets", targets));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "targets", targets, n, "one per row"));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "max", max, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "max", max, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "sums", sums, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "sums", *sums, 2 * n, "[2, rows]"));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"logits", &logits}, {"targets", &targets}, {"max", &max}, {"sums", sums}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::VocabSumExp(internal::ElemOf(logits.dtype()), logits.raw_data(),
                                             internal::IndexOf(targets.dtype()), targets.raw_data(),
                                             n, logits.dim(logits.rank() - 1), shard.valid,
                                             shard.vocab_start, max.data<float>(),
                                             sums->data<float>(), stream));
  return absl::OkStatus();
}

absl::Status VocabShardRowMaxSumExp(const Tensor& logits, const Tensor& targets,
                                    const cpu::VocabShard& shard, Tensor* max, Tensor* sums) {
  constexpr const char* kOp = "VocabShardRowMaxSumExp";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "targets", targets));
  LOOM_ASSIGN_OR_RETURN(const int64_t n, ops::CheckVocabShardRows(kOp, logits, targets, shard));
  LOOM_RETURN_IF_ERROR(internal::CheckRows(kOp, "rows", n));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "max", max, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "max", *max, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "sums", sums, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "sums", *sums, 2 * n, "[2, rows]"));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(
      kOp, {{"logits", &logits}, {"targets", &targets}, {"max", max}, {"sums", sums}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::VocabMaxSumExp(internal::ElemOf(logits.dtype()),
                                                logits.raw_data(),
                                                internal::IndexOf(targets.dtype()),
                                                targets.raw_data(), n,
                                                logits.dim(logits.rank() - 1), shard.valid,
                                                shard.vocab_start, max->data<float>(),
                                                sums->data<float>(), stream));
  return absl::OkStatus();
}

absl::Status VocabShardRescaleSums(const Tensor& logits, const Tensor& targets,
                                   const Tensor& local_max, const Tensor& max,
                                   const cpu::VocabShard& shard, Tensor* sums) {
  constexpr const char* kOp = "VocabShardRescaleSums";
  LOOM_RETURN_IF_ERROR(internal::CheckFloat(kOp, "logits", logits));
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "targets", targets));
  LOOM_ASSIGN_OR_RETURN(const int64_t n, ops::CheckVocabShardRows(kOp, logits, targets, shard));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "local_max", local_max, DType::kF32));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "max", max, DType::kF32));
  LOOM_RETURN_IF_ERROR(internal::CheckIs(kOp, "sums", sums, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckVocabRescaleArgs(kOp, n, local_max, max, sums));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"logits", &logits},
                                                    {"targets", &targets},
                                                    {"local_max", &local_max},
                                                    {"max", &max},
                                                    {"sums", sums}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::VocabRescaleSums(
                            internal::ElemOf(logits.dtype()), logits.raw_data(),
                            internal::IndexOf(targets.dtype()), targets.raw_data(), n,
                            logits.dim(logits.rank() - 1), shard.valid, shard.vocab_start,
                            local_max.data<float>(), max.data<float>(), sums->data<float>(),
                            stream));
  return absl::OkStatus();
}

absl::Status VocabShardCrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                            const Tensor& max, const Tensor& sum,
                                            const cpu::VocabShard& shard, float scale,
                                            Tensor* dlogits) {
  constexpr const char* kOp = "VocabShardCrossEntropyBackward";
  LOOM_ASSIGN_OR_RETURN(const int64_t n, CheckShard(kOp, logits, shard));
  LOOM_RETURN_IF_ERROR(internal::CheckIds(kOp, "targets", targets));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "targets", targets, n, "one per row"));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "max", max, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "max", max, n, "one per row"));
  LOOM_RETURN_IF_ERROR(CheckDTypeIs(kOp, "sum", sum, DType::kF32));
  LOOM_RETURN_IF_ERROR(ops::CheckNumel(kOp, "sum", sum, n, "one per row"));
  LOOM_RETURN_IF_ERROR(internal::CheckFloatOut(kOp, "dlogits", dlogits));
  LOOM_RETURN_IF_ERROR(internal::CheckSameDType(kOp, "logits", logits, "dlogits", *dlogits));
  LOOM_RETURN_IF_ERROR(CheckSameShape(kOp, "logits", logits, "dlogits", *dlogits));
  LOOM_RETURN_IF_ERROR(internal::CheckDevices(kOp, {{"logits", &logits},
                                                    {"targets", &targets},
                                                    {"max", &max},
                                                    {"sum", &sum},
                                                    {"dlogits", dlogits}}));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, internal::Stream());
  LOOM_CUDA_LAUNCH(kOp, kernels::VocabCrossEntropyBackward(
                            internal::ElemOf(logits.dtype()), logits.raw_data(),
                            internal::IndexOf(targets.dtype()), targets.raw_data(), n,
                            logits.dim(logits.rank() - 1), shard.valid, shard.vocab_start,
                            max.data<float>(), sum.data<float>(), scale, dlogits->raw_data(),
                            stream));
  return absl::OkStatus();
}

}  // namespace loom::core::cuda
