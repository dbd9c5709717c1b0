#ifndef LOOM_TRAIN_DATA_BLEND_H_
#define LOOM_TRAIN_DATA_BLEND_H_

// Dataset blends with Megatron's semantics: `--data-path 0.3 A 0.7 B` draws
// 30% of the samples from corpus A and 70% from B, interleaved.
//
// What Megatron-Core does (blended_megatron_dataset_builder.py,
// blended_dataset.py, helpers.cpp), and so what this does, for one split
// (train, valid or test) that asks for `size` samples:
//  1. the weights are normalised to sum to 1 (numpy's pairwise sum);
//  2. dataset k must give ceil(size * w_k) samples; its own GptDataset is built
//     for ceil(ceil(size * w_k) * (1 + 0.005)) (the mid-level surplus), so the
//     blend never asks a dataset for more than it holds;
//  3. the blend holds sum_k ceil(size * w_k) samples (>= size), and sample i is
//     sample dataset_sample_index[i] of dataset dataset_index[i], where the two
//     arrays are built greedily: sample i goes to the dataset whose count lags
//     furthest behind w_k * max(i, 1) (the first such on a tie), and takes
//     that dataset's next sample.
// The arrays are a function of the weights and the size alone, cached under
// --data-cache-path; a training run reads blend sample `consumed + j`, so a
// resumed run in any layout continues exactly where it stopped.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/data/gpt_dataset.h"
#include "train/data/indexed_dataset.h"

namespace loom::train {

// Megatron's mid_level_dataset_surplus default (BlendedMegatronDatasetConfig).
inline constexpr double kMidLevelDatasetSurplus = 0.005;

// A parsed --data-path (or --train-data-path, ...): one prefix, or weight /
// prefix pairs.
struct BlendSpec {
  std::vector<std::string> prefixes;
  // Normalised, one per prefix; empty for a single prefix given alone (no
  // blend: that dataset is used as is, as Megatron does).
  std::vector<double> weights;
};

// Parses Megatron's list form: `PREFIX`, or `W1 PREFIX1 W2 PREFIX2 ...` with
// non-negative weights, not all zero. Entries are separated by whitespace (one
// flag value: --data-path="0.3 A 0.7 B"); a value that names an existing
// corpus as a whole (<value>.idx exists) is that one prefix even if it holds
// spaces (a list's prefixes cannot). Errors name `flag` and the entry:
// an odd-length weight list, a weight that is not a number or is negative,
// several prefixes without weights, an empty list.
absl::StatusOr<BlendSpec> ParseBlend(absl::string_view flag, absl::string_view value);

// Every prefix's <prefix>.idx and <prefix>.bin exist (checked before any work
// starts); an error names `flag` and the missing file.
absl::Status CheckBlendFiles(absl::string_view flag, const BlendSpec& blend);

// w / sum(w), the sum as numpy.sum computes it (pairwise, eight accumulators
// from eight weights on), as megatron.core.datasets.utils.normalize does.
std::vector<double> NormalizeBlendWeights(const std::vector<double>& weights);

// ceil(ceil(size * w_k) * (1 + surplus)) for each normalised weight w_k
// (Megatron's _get_size_per_split_per_dataset).
std::vector<int64_t> BlendSamplesPerDataset(const std::vector<double>& weights, int64_t size,
                                            double surplus = 0.0);

// Megatron-Core's helpers.cpp build_blending_indices: `size` entries.
struct BlendingIndices {
  std::vector<int16_t> dataset_index;         // which dataset gives sample i
  std::vector<int64_t> dataset_sample_index;  // which of its samples
};
BlendingIndices BuildBlendingIndices(const std::vector<double>& weights, int64_t size);

// What a cache name is made of for one corpus: its prefix and the size and
// modification time of its .idx and .bin (a re-tokenized corpus gets new ones).
absl::StatusOr<std::string> DatasetFingerprint(const std::string& prefix);

// One corpus of a blend, opened by the caller, and the documents of the split.
struct BlendSource {
  const IndexedDataset* data = nullptr;
  std::string prefix;
  DocumentRange documents;
};

struct BlendedDatasetOptions {
  int64_t seq_length = 128;    // --seq-length
  int64_t num_samples = 0;     // samples the split asks for (the blend may hold a few more)
  uint64_t seed = 1234;        // --seed, every corpus's sample order
  std::string split;           // --split as given (part of the cache key)
  std::string cache_dir;       // --data-cache-path ("" = no cache)
  std::string name = "train";  // split name, part of the cache file names
};

// Samples drawn from several GptDatasets by Megatron's blending indices, or
// from one GptDataset as is (a single source without weights).
class BlendedDataset {
 public:
  // `weights` are normalised, one per source, or empty with one source. Each
  // source's GptDataset is built (or loaded) for its share plus the surplus,
  // in a blend with a cache name that holds the corpus's fingerprint; the blending
  // indices are cached in cache_dir as blend_<name>_<hash>.blendidx, the hash
  // over every input (fingerprints, documents, weights, size, seed, split),
  // written to a temporary file and renamed (several ranks may write it), and
  // rebuilt when any input changes or the file is damaged.
  static absl::StatusOr<std::unique_ptr<BlendedDataset>> Build(std::vector<BlendSource> sources,
                                                               std::vector<double> weights,
                                                               const BlendedDatasetOptions& options);

  int64_t num_samples() const { return num_samples_; }
  int64_t seq_length() const { return options_.seq_length; }
  int num_datasets() const { return static_cast<int>(datasets_.size()); }
  const GptDataset& dataset(int k) const { return *datasets_[k]; }
  // Whether the blending indices came from the cache (false without a blend).
  bool indices_loaded_from_cache() const { return loaded_from_cache_; }
  const std::string& cache_path() const { return cache_path_; }

  // Blend sample i is sample `sample` of dataset `dataset` (0 <= i < num_samples).
  struct Location {
    int dataset = 0;
    int64_t sample = 0;
  };
  absl::StatusOr<Location> Locate(int64_t i) const;

  // As GptDataset::SampleTokens, for blend sample i.
  absl::Status SampleTokens(int64_t i, int64_t first, int64_t count, int32_t* out) const;

  const BlendingIndices& indices() const { return indices_; }

 private:
  BlendedDataset() = default;
  bool LoadCache(const std::string& description);
  absl::Status SaveCache(const std::string& description) const;

  BlendedDatasetOptions options_;
  std::vector<std::unique_ptr<GptDataset>> datasets_;
  BlendingIndices indices_;  // empty without a blend
  int64_t num_samples_ = 0;
  bool loaded_from_cache_ = false;
  std::string cache_path_;
};

// The training and validation samples of a run, as Megatron's
// BlendedMegatronDatasetBuilder makes them: from --data-path (each corpus's
// documents split by --split, the splits blended alike), or from
// --train-data-path / --valid-data-path (whole corpora, one blend a split).
struct DataSplitsOptions {
  std::string data_path;        // a ParseBlend list, or ""
  std::string train_data_path;  // used when data_path is ""
  std::string valid_data_path;
  std::string split = "969,30,1";
  int64_t seq_length = 128;
  uint64_t seed = 1234;
  std::string cache_dir;
  int64_t train_samples = 0;  // 0: no training split
  int64_t valid_samples = 0;  // 0: no validation split
};
struct DataSplits {
  std::vector<std::unique_ptr<IndexedDataset>> corpora;  // what the datasets read
  std::unique_ptr<BlendedDataset> train, valid;          // null when not asked for or empty
};
// Errors name the flag and the file. With --data-path, a validation split
// that is empty in every corpus gives no validation data (as before blends);
// empty in only some of them is an error naming the corpus.
absl::StatusOr<DataSplits> BuildDataSplits(const DataSplitsOptions& options);

// --mock-data: a synthetic corpus (1000 documents of 1 to 1023 tokens, token k
// of document d is 1 + (d + k) mod (vocab_size - 1), each ending in 0),
// written once to cache_dir as mock_v1_<vocab_size>.{bin,idx} (temporary names
// renamed, the .idx last). Returns its prefix.
absl::StatusOr<std::string> PrepareMockData(const std::string& cache_dir, int64_t vocab_size);

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_BLEND_H_
