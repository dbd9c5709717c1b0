#ifndef LOOM_TRAIN_DATA_GPT_DATASET_H_
#define LOOM_TRAIN_DATA_GPT_DATASET_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/data/indexed_dataset.h"

namespace loom::train {

// --split "969,30,1": weights of the train/valid/test document ranges.
struct DocumentRange {
  int64_t begin = 0;  // first document
  int64_t end = 0;    // one past the last
};
absl::StatusOr<std::array<DocumentRange, 3>> SplitDocuments(const std::string& split,
                                                            int64_t num_documents);

struct GptDatasetOptions {
  int64_t seq_length = 128;   // --seq-length; each sample holds seq_length + 1 tokens
  int64_t num_samples = 0;    // samples needed (iterations x global batch)
  uint64_t seed = 1234;       // --seed
  DocumentRange documents;    // which documents (one split)
  std::string cache_dir;      // where index files are cached ("" = no cache)
  std::string name = "train"; // part of the cache file name
};

// Megatron's GPT sample construction: the documents of one split are
// concatenated, in an order shuffled per epoch (as many epochs as needed),
// and cut into samples of seq_length + 1 tokens that overlap by one token
// (inputs = tokens[0..s), labels = tokens[1..s]); the samples are then
// shuffled. The three index arrays are built once from the seed and cached
// in cache_dir, so every rank and every restart sees the same order.
class GptDataset {
 public:
  static absl::StatusOr<std::unique_ptr<GptDataset>> Build(const IndexedDataset* data,
                                                           const GptDatasetOptions& options);

  int64_t num_samples() const { return options_.num_samples; }
  int64_t seq_length() const { return options_.seq_length; }
  int64_t epochs() const { return epochs_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

  // Writes the seq_length + 1 tokens of sample i (0 <= i < num_samples).
  absl::Status Sample(int64_t i, int32_t* out) const;
  // Writes tokens [first, first + count) of sample i, reading only those: a
  // context-parallel rank's chunks (0 <= first, first + count <= seq_length + 1).
  absl::Status SampleTokens(int64_t i, int64_t first, int64_t count, int32_t* out) const;

 private:
  GptDataset(const IndexedDataset* data, GptDatasetOptions options)
      : data_(data), options_(std::move(options)) {}
  absl::Status BuildIndices();
  bool LoadCache(const std::string& path);
  absl::Status SaveCache(const std::string& path) const;

  const IndexedDataset* data_;
  GptDatasetOptions options_;
  int64_t epochs_ = 0;
  bool loaded_from_cache_ = false;
  std::vector<int32_t> doc_idx_;      // documents in visiting order, all epochs
  std::vector<int64_t> sample_idx_;   // (position in doc_idx_, token offset) pairs, n+1 of them
  std::vector<int64_t> shuffle_idx_;  // sample order
};

// Which samples a data-parallel rank reads: Megatron's pretraining sampler.
// Step t's global batch is samples [consumed, consumed + global_batch); each
// micro-batch slot m of DP rank r takes micro_batch_size consecutive samples.
// The loader position (consumed samples) is part of the training state.
int64_t SampleIndexFor(int64_t consumed_samples, int64_t micro_batch, int64_t micro_batch_size,
                       int64_t dp_rank, int64_t dp_size, int64_t row);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_GPT_DATASET_H_
