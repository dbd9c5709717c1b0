#include "train/data/blend.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "train/data/index_file.h"

namespace loom::train {
namespace {

constexpr char kCacheMagic[8] = {'L', 'O', 'O', 'M', 'B', 'L', 'D', '1'};

// numpy's pairwise summation of float64 (loops_utils.h: fewer than eight
// terms in order; up to 128 with eight accumulators; above, halves), added to
// the reduction's initial 0 as numpy.sum does.
double NumpyPairwiseSum(const double* a, int64_t n) {
  if (n < 8) {
    double sum = 0.;
    for (int64_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return NumpyPairwiseSum(a, half) + NumpyPairwiseSum(a + half, n - half);
}

// FNV-1a, 64 bits: a stable name for a description (the description itself is
// stored in the file and compared, so a collision only costs a rebuild).
std::string Hash(absl::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrFormat("%016x", h);
}

bool IsNumber(absl::string_view s, double* value) {
  return absl::SimpleAtod(s, value) && std::isfinite(*value);
}

}  // namespace

absl::StatusOr<BlendSpec> ParseBlend(absl::string_view flag, absl::string_view value) {
  // A value that names a corpus as a whole is that one prefix, spaces and
  // all: users' folders have them, and so may the cache folder the default
  // corpus lives in.
  const std::string whole(absl::StripAsciiWhitespace(value));
  std::error_code ec;
  if (!whole.empty() && std::filesystem::exists(whole + ".idx", ec)) {
    BlendSpec one;
    one.prefixes = {whole};
    return one;
  }
  std::vector<std::string> entries = absl::StrSplit(value, absl::ByAnyChar(" \t\n"),
                                                    absl::SkipEmpty());
  if (entries.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " is empty: expected a dataset prefix or weight/prefix pairs, e.g. ",
                     flag, "=\"0.3 data/a 0.7 data/b\""));
  }
  BlendSpec spec;
  if (entries.size() == 1) {
    spec.prefixes = entries;
    return spec;
  }
  double first;
  if (!IsNumber(entries[0], &first)) {
    for (const std::string& e : entries) {
      double w;
      if (IsNumber(e, &w)) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, "=\"", value, "\": expected weight/prefix pairs (\"0.3 data/a 0.7 data/b\"), "
            "but the list starts with the prefix \"", entries[0], "\" and holds the number ", e));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=\"", value, "\": ", entries.size(),
        " prefixes without weights; give each a weight (\"1 ", entries[0], " 1 ", entries[1],
        " ...\" for equal shares)"));
  }
  if (entries.size() % 2 == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=\"", value, "\": ", entries.size(),
        " entries, an odd number: expected weight/prefix pairs; the weight ", entries.back(),
        " has no prefix"));
  }
  if (entries.size() / 2 >= std::numeric_limits<int16_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", entries.size() / 2,
                                                   " datasets; a blend holds at most 32766"));
  }
  std::vector<double> weights;
  for (size_t i = 0; i < entries.size(); i += 2) {
    double w;
    if (!IsNumber(entries[i], &w)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=\"", value, "\": \"", entries[i],
                       "\" stands where a weight goes (before the prefix ", entries[i + 1],
                       ") and is not a number"));
    }
    if (w <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": the weight of ", entries[i + 1], " is ", entries[i],
          "; weights must be positive (leave a corpus out rather than give it weight 0)"));
    }
    weights.push_back(w);
    spec.prefixes.push_back(entries[i + 1]);
  }
  spec.weights = NormalizeBlendWeights(weights);
  return spec;
}

absl::Status CheckBlendFiles(absl::string_view flag, const BlendSpec& blend) {
  for (const std::string& prefix : blend.prefixes) {
    for (const char* ext : {".idx", ".bin"}) {
      const std::string path = absl::StrCat(prefix, ext);
      std::error_code error;
      if (!std::filesystem::is_regular_file(path, error)) {
        std::string hint = "give the prefix that //train:preprocess_data's --output-prefix wrote";
        if (absl::EndsWith(prefix, ".idx") || absl::EndsWith(prefix, ".bin")) {
          hint = absl::StrCat("give the prefix without the extension (",
                              prefix.substr(0, prefix.size() - 4), ")");
        }
        return absl::NotFoundError(absl::StrCat(flag, ": the dataset prefix ", prefix, " has no ",
                                                path, "; ", hint));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<double> NormalizeBlendWeights(const std::vector<double>& weights) {
  const double sum = 0. + NumpyPairwiseSum(weights.data(), static_cast<int64_t>(weights.size()));
  std::vector<double> normalized;
  normalized.reserve(weights.size());
  for (double w : weights) normalized.push_back(w / sum);
  return normalized;
}

std::vector<int64_t> BlendSamplesPerDataset(const std::vector<double>& weights, int64_t size,
                                            double surplus) {
  std::vector<int64_t> samples;
  samples.reserve(weights.size());
  for (double w : weights) {
    // Python: int(math.ceil(math.ceil(size * w) * (1 + surplus))).
    const double share = std::ceil(static_cast<double>(size) * w);
    samples.push_back(static_cast<int64_t>(std::ceil(share * (1.0 + surplus))));
  }
  return samples;
}

BlendingIndices BuildBlendingIndices(const std::vector<double>& weights, int64_t size) {
  BlendingIndices out;
  out.dataset_index.resize(size);
  out.dataset_sample_index.resize(size);
  std::vector<int64_t> current(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    // The dataset whose count lags furthest behind its share; the first on a
    // tie. Ties are common (7/10 * 10 - 7 == 2/10 * 10 - 2 == 0): the product
    // must be rounded before the subtraction, as in Megatron's build, so this
    // file is compiled with -ffp-contract=off (no fused multiply-add).
    const double at = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * at - static_cast<double>(current[0]);
    for (size_t k = 1; k < weights.size(); ++k) {
      const double error = weights[k] * at - static_cast<double>(current[k]);
      if (error > best_error) {
        best_error = error;
        best = k;
      }
    }
    out.dataset_index[i] = static_cast<int16_t>(best);
    out.dataset_sample_index[i] = current[best]++;
  }
  return out;
}

absl::StatusOr<std::string> DatasetFingerprint(const std::string& prefix) {
  std::string fingerprint = prefix;
  for (const char* ext : {".idx", ".bin"}) {
    const std::string path = absl::StrCat(prefix, ext);
    std::error_code error;
    const uintmax_t size = std::filesystem::file_size(path, error);
    if (error) {
      return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", error.message()));
    }
    const auto mtime = std::filesystem::last_write_time(path, error);
    if (error) {
      return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", error.message()));
    }
    absl::StrAppend(&fingerprint, " ", ext, ":", size, "@",
                    static_cast<int64_t>(mtime.time_since_epoch().count()));
  }
  return fingerprint;
}

absl::StatusOr<std::unique_ptr<BlendedDataset>> BlendedDataset::Build(
    std::vector<BlendSource> sources, std::vector<double> weights,
    const BlendedDatasetOptions& options) {
  if (sources.empty()) return absl::InvalidArgumentError("a blend of no datasets");
  if (!weights.empty() && weights.size() != sources.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a blend of ", sources.size(),
                                                   " datasets with ", weights.size(), " weights"));
  }
  if (weights.empty() && sources.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a blend of ", sources.size(), " datasets needs a weight for each"));
  }
  std::unique_ptr<BlendedDataset> blend(new BlendedDataset());
  blend->options_ = options;
  const bool blended = !weights.empty();
  // Samples each dataset is built for: its share plus Megatron's surplus.
  const std::vector<int64_t> built =
      blended ? BlendSamplesPerDataset(weights, options.num_samples, kMidLevelDatasetSurplus)
              : std::vector<int64_t>{options.num_samples};
  std::string description = absl::StrCat(
      "loom blend 1\nsplit_name=", options.name, " seq_length=", options.seq_length,
      " seed=", options.seed, " split=", options.split, " num_samples=", options.num_samples,
      "\n");
  for (size_t k = 0; k < sources.size(); ++k) {
    const BlendSource& source = sources[k];
    absl::StatusOr<std::string> fingerprint = DatasetFingerprint(source.prefix);
    if (!fingerprint.ok()) return fingerprint.status();
    absl::StrAppend(&description, "weight=", blended ? absl::StrFormat("%a", weights[k]) : "none",
                    " documents=", source.documents.begin, "-", source.documents.end, " ",
                    *fingerprint, "\n");
    GptDatasetOptions o;
    o.seq_length = options.seq_length;
    o.num_samples = built[k];
    o.seed = options.seed;
    o.documents = source.documents;
    o.cache_dir = options.cache_dir;
    // In a blend the corpus is part of the name: two corpora with the same
    // document range never share a sample index, and a re-tokenized one gets
    // its own. A single corpus keeps the plain name (its files and messages
    // as before blends).
    o.name = blended ? absl::StrCat(options.name, "_", Hash(*fingerprint)) : options.name;
    absl::StatusOr<std::unique_ptr<GptDataset>> dataset = GptDataset::Build(source.data, o);
    if (!dataset.ok()) {
      return absl::Status(dataset.status().code(),
                          absl::StrCat(source.prefix, ": ", dataset.status().message()));
    }
    blend->datasets_.push_back(*std::move(dataset));
  }
  if (!blended) {
    blend->num_samples_ = options.num_samples;
    return blend;
  }
  // The blend's size: every dataset's share, rounded up.
  const std::vector<int64_t> shares = BlendSamplesPerDataset(weights, options.num_samples);
  blend->num_samples_ = 0;
  for (int64_t s : shares) blend->num_samples_ += s;

  if (!options.cache_dir.empty()) {
    blend->cache_path_ = absl::StrCat(options.cache_dir, "/blend_", options.name, "_",
                                      Hash(description), ".blendidx");
    if (blend->LoadCache(description)) {
      blend->loaded_from_cache_ = true;
      return blend;
    }
  }
  blend->indices_ = BuildBlendingIndices(weights, blend->num_samples_);
  // As Megatron: a blend never reads past what a dataset was built for.
  std::vector<int64_t> used(sources.size(), 0);
  for (int16_t k : blend->indices_.dataset_index) ++used[k];
  for (size_t k = 0; k < sources.size(); ++k) {
    if (used[k] > blend->datasets_[k]->num_samples()) {
      return absl::InternalError(absl::StrCat(
          "the ", options.name, " blend takes ", used[k], " samples from ", sources[k].prefix,
          ", more than the ", blend->datasets_[k]->num_samples(), " built for it"));
    }
  }
  if (!blend->cache_path_.empty()) {
    std::error_code made;
    std::filesystem::create_directories(options.cache_dir, made);
    if (made) {
      return absl::PermissionDeniedError(absl::StrCat("cannot create the cache folder ",
                                                      options.cache_dir, ": ", made.message()));
    }
    absl::Status saved = blend->SaveCache(description);
    if (!saved.ok()) return saved;
  }
  return blend;
}

absl::StatusOr<BlendedDataset::Location> BlendedDataset::Locate(int64_t i) const {
  if (i < 0 || i >= num_samples_) {
    return absl::OutOfRangeError(
        absl::StrCat("sample ", i, " outside the ", num_samples_, " samples of the blend"));
  }
  if (indices_.dataset_index.empty()) return Location{0, i};
  return Location{indices_.dataset_index[i], indices_.dataset_sample_index[i]};
}

absl::Status BlendedDataset::SampleTokens(int64_t i, int64_t first, int64_t count,
                                          int32_t* out) const {
  absl::StatusOr<Location> at = Locate(i);
  if (!at.ok()) return at.status();
  return datasets_[at->dataset]->SampleTokens(at->sample, first, count, out);
}

bool BlendedDataset::LoadCache(const std::string& description) {
  std::ifstream in(cache_path_, std::ios::binary);
  if (!in) return false;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kCacheMagic, 8) != 0) return false;
  size_t pos = 8;
  std::vector<char> stored;
  BlendingIndices indices;
  // A damaged or foreign file is rebuilt rather than trusted.
  if (!ReadVec(bytes, &pos, &stored) || std::string(stored.begin(), stored.end()) != description ||
      !ReadVec(bytes, &pos, &indices.dataset_index) ||
      !ReadVec(bytes, &pos, &indices.dataset_sample_index) || pos != bytes.size() ||
      int64_t(indices.dataset_index.size()) != num_samples_ ||
      int64_t(indices.dataset_sample_index.size()) != num_samples_) {
    return false;
  }
  for (int64_t i = 0; i < num_samples_; ++i) {
    const int16_t k = indices.dataset_index[i];
    if (k < 0 || k >= num_datasets() || indices.dataset_sample_index[i] < 0 ||
        indices.dataset_sample_index[i] >= datasets_[k]->num_samples()) {
      return false;
    }
  }
  indices_ = std::move(indices);
  return true;
}

absl::Status BlendedDataset::SaveCache(const std::string& description) const {
  std::string bytes(kCacheMagic, 8);
  AppendVec(&bytes, std::vector<char>(description.begin(), description.end()));
  AppendVec(&bytes, indices_.dataset_index);
  AppendVec(&bytes, indices_.dataset_sample_index);
  // Several ranks may build the same blend: each writes its own temporary
  // file and renames it, so a reader only ever sees a complete file.
  const std::string tmp = absl::StrCat(cache_path_, ".tmp", std::random_device()());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write the blend index ", tmp));
  }
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), cache_path_.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("writing the blend index ", cache_path_, " failed"));
  }
  return absl::OkStatus();
}

namespace {

// One split's blend over `corpora` (opened from `spec`, in order).
absl::StatusOr<std::unique_ptr<BlendedDataset>> BuildSplit(
    absl::string_view flag, const BlendSpec& spec,
    const std::vector<const IndexedDataset*>& corpora, const std::vector<DocumentRange>& documents,
    const DataSplitsOptions& options, int64_t num_samples, const std::string& split,
    const std::string& name) {
  std::vector<BlendSource> sources;
  for (size_t k = 0; k < corpora.size(); ++k) {
    sources.push_back({corpora[k], spec.prefixes[k], documents[k]});
  }
  BlendedDatasetOptions o;
  o.seq_length = options.seq_length;
  o.num_samples = num_samples;
  o.seed = options.seed;
  o.split = split;
  o.cache_dir = options.cache_dir;
  o.name = name;
  absl::StatusOr<std::unique_ptr<BlendedDataset>> blend =
      BlendedDataset::Build(std::move(sources), spec.weights, o);
  if (!blend.ok()) {
    return absl::Status(blend.status().code(),
                        absl::StrCat(flag, " (", name, "): ", blend.status().message()));
  }
  return blend;
}

absl::StatusOr<std::vector<const IndexedDataset*>> OpenCorpora(absl::string_view flag,
                                                               const BlendSpec& spec,
                                                               DataSplits* out) {
  std::vector<const IndexedDataset*> opened;
  for (const std::string& prefix : spec.prefixes) {
    absl::StatusOr<std::unique_ptr<IndexedDataset>> data = IndexedDataset::Open(prefix);
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat(flag, ": ", data.status().message()));
    }
    opened.push_back(data->get());
    out->corpora.push_back(*std::move(data));
  }
  return opened;
}

}  // namespace

absl::StatusOr<DataSplits> BuildDataSplits(const DataSplitsOptions& options) {
  DataSplits out;
  if (!options.data_path.empty()) {
    absl::StatusOr<BlendSpec> spec = ParseBlend("--data-path", options.data_path);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::vector<const IndexedDataset*>> corpora =
        OpenCorpora("--data-path", *spec, &out);
    if (!corpora.ok()) return corpora.status();
    std::vector<DocumentRange> train, valid;
    int empty_valid = 0;
    for (size_t k = 0; k < corpora->size(); ++k) {
      absl::StatusOr<std::array<DocumentRange, 3>> splits =
          SplitDocuments(options.split, (*corpora)[k]->num_documents());
      if (!splits.ok()) return splits.status();
      train.push_back((*splits)[0]);
      valid.push_back((*splits)[1]);
      if ((*splits)[1].end == (*splits)[1].begin) ++empty_valid;
    }
    if (options.train_samples > 0) {
      absl::StatusOr<std::unique_ptr<BlendedDataset>> blend =
          BuildSplit("--data-path", *spec, *corpora, train, options, options.train_samples,
                     options.split, "train");
      if (!blend.ok()) return blend.status();
      out.train = *std::move(blend);
    }
    if (options.valid_samples > 0 && empty_valid < int(corpora->size())) {
      if (empty_valid > 0) {
        for (size_t k = 0; k < valid.size(); ++k) {
          if (valid[k].end == valid[k].begin) {
            return absl::InvalidArgumentError(absl::StrCat(
                "--split=", options.split, " leaves no validation documents in ",
                spec->prefixes[k], " (", (*corpora)[k]->num_documents(),
                " documents) while the blend's other corpora have some: give it a larger "
                "validation share or use --valid-data-path"));
          }
        }
      }
      absl::StatusOr<std::unique_ptr<BlendedDataset>> blend =
          BuildSplit("--data-path", *spec, *corpora, valid, options, options.valid_samples,
                     options.split, "valid");
      if (!blend.ok()) return blend.status();
      out.valid = *std::move(blend);
    }
    return out;
  }
  const struct {
    const char* flag;
    const std::string& value;
    int64_t samples;
    const char* name;
  } per_split[] = {{"--train-data-path", options.train_data_path, options.train_samples, "train"},
                   {"--valid-data-path", options.valid_data_path, options.valid_samples, "valid"}};
  for (const auto& s : per_split) {
    if (s.value.empty() || s.samples == 0) continue;
    absl::StatusOr<BlendSpec> spec = ParseBlend(s.flag, s.value);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::vector<const IndexedDataset*>> corpora = OpenCorpora(s.flag, *spec, &out);
    if (!corpora.ok()) return corpora.status();
    std::vector<DocumentRange> whole;
    for (const IndexedDataset* c : *corpora) whole.push_back({0, int64_t(c->num_documents())});
    absl::StatusOr<std::unique_ptr<BlendedDataset>> blend =
        BuildSplit(s.flag, *spec, *corpora, whole, options, s.samples, "whole", s.name);
    if (!blend.ok()) return blend.status();
    (std::string(s.name) == "train" ? out.train : out.valid) = *std::move(blend);
  }
  return out;
}

absl::StatusOr<std::string> PrepareMockData(const std::string& cache_dir, int64_t vocab_size) {
  if (vocab_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mock-data needs a vocabulary of 2 tokens or more, not ", vocab_size));
  }
  const std::string prefix = absl::StrCat(cache_dir, "/mock_v1_", vocab_size);
  std::error_code error;
  if (std::filesystem::is_regular_file(prefix + ".idx", error) &&
      std::filesystem::is_regular_file(prefix + ".bin", error)) {
    return prefix;
  }
  std::filesystem::create_directories(cache_dir, error);
  if (error) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create the cache folder ", cache_dir, " (--data-cache-path): ", error.message()));
  }
  const std::string tmp = absl::StrCat(prefix, ".tmp", std::random_device()());
  absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> writer =
      IndexedDatasetWriter::Create(tmp, TokenType::kI32);
  if (!writer.ok()) return writer.status();
  for (int64_t d = 0; d < 1000; ++d) {
    std::vector<int32_t> tokens(1 + (d * 7919 + 13) % 1023);
    for (size_t k = 0; k + 1 < tokens.size(); ++k) {
      tokens[k] = static_cast<int32_t>(1 + (d + int64_t(k)) % (vocab_size - 1));
    }
    tokens.back() = 0;
    absl::Status s = (*writer)->AddSequence(tokens.data(), tokens.size());
    if (s.ok()) s = (*writer)->EndDocument();
    if (!s.ok()) return s;
  }
  absl::Status s = (*writer)->Finalize();
  if (!s.ok()) return s;
  // The .idx last: a reader that finds it finds the .bin whole.
  for (const char* ext : {".bin", ".idx"}) {
    if (std::rename((tmp + ext).c_str(), (prefix + ext).c_str()) != 0) {
      std::remove((tmp + ".bin").c_str());
      std::remove((tmp + ".idx").c_str());
      return absl::DataLossError(absl::StrCat("writing the mock corpus ", prefix, ext, " failed"));
    }
  }
  return prefix;
}

}  // namespace loom::train
