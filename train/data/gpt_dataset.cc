#include "train/data/gpt_dataset.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "train/data/index_file.h"

namespace loom::train {
namespace {

constexpr char kCacheMagic[8] = {'L', 'O', 'O', 'M', 'G', 'P', 'T', '1'};

// Fisher-Yates with a fixed generator: std::shuffle's algorithm is not
// specified, and the order must not change with the standard library.
template <typename T>
void Shuffle(std::vector<T>* v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = v->size(); i > 1; --i) {
    size_t j = rng() % i;
    std::swap((*v)[i - 1], (*v)[j]);
  }
}

}  // namespace

absl::StatusOr<std::array<DocumentRange, 3>> SplitDocuments(const std::string& split,
                                                            int64_t num_documents) {
  std::vector<std::string> parts = absl::StrSplit(split, absl::ByAnyChar(",/"));
  if (parts.empty() || parts.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--split=", split, ": expected up to three comma-separated weights, e.g. 969,30,1"));
  }
  double weights[3] = {0, 0, 0}, total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!absl::SimpleAtod(parts[i], &weights[i]) || weights[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--split=", split, ": \"", parts[i],
                                                     "\" is not a non-negative number"));
    }
    total += weights[i];
  }
  if (total <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--split=", split, ": weights sum to zero"));
  }
  // Megatron: cumulative rounded boundaries, the last one pinned to N.
  std::array<DocumentRange, 3> ranges;
  int64_t begin = 0;
  double cumulative = 0;
  for (int i = 0; i < 3; ++i) {
    cumulative += weights[i] / total;
    int64_t end = i == 2 ? num_documents
                         : std::min<int64_t>(num_documents, std::llround(cumulative * num_documents));
    ranges[i] = DocumentRange{begin, std::max(begin, end)};
    begin = ranges[i].end;
  }
  return ranges;
}

absl::StatusOr<std::unique_ptr<GptDataset>> GptDataset::Build(const IndexedDataset* data,
                                                              const GptDatasetOptions& options) {
  if (options.seq_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq-length=", options.seq_length, ": expected >= 1"));
  }
  if (options.documents.begin < 0 || options.documents.end > int64_t(data->num_documents()) ||
      options.documents.begin > options.documents.end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "document range [", options.documents.begin, ", ", options.documents.end,
        ") is outside the dataset's ", data->num_documents(), " documents"));
  }
  std::unique_ptr<GptDataset> ds(new GptDataset(data, options));
  if (options.num_samples == 0) return ds;
  std::string cache;
  if (!options.cache_dir.empty()) {
    cache = absl::StrCat(options.cache_dir, "/", options.name, "_s", options.seq_length, "_n",
                         options.num_samples, "_seed", options.seed, "_docs",
                         options.documents.begin, "-", options.documents.end, ".gptidx");
    if (ds->LoadCache(cache)) {
      ds->loaded_from_cache_ = true;
      return ds;
    }
  }
  absl::Status built = ds->BuildIndices();
  if (!built.ok()) return built;
  if (!cache.empty()) {
    // A new --data-cache-dir is created, parents included (no shell involved).
    std::error_code made;
    std::filesystem::create_directories(options.cache_dir, made);
    if (made) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot create the sample index cache folder ", options.cache_dir,
          " (--data-cache-dir): ", made.message()));
    }
    absl::Status saved = ds->SaveCache(cache);
    if (!saved.ok()) return saved;
  }
  return ds;
}

absl::Status GptDataset::BuildIndices() {
  const std::vector<int64_t>& docs = data_->document_index();
  const int64_t first = docs[options_.documents.begin];
  const int64_t last = docs[options_.documents.end];  // sequences [first, last)
  int64_t tokens_per_epoch = 0;
  for (int64_t s = first; s < last; ++s) tokens_per_epoch += data_->sequence_length(s);
  if (tokens_per_epoch < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", options_.name, " split holds ", tokens_per_epoch,
                     " tokens: too few to build samples (check --split and --data-path)"));
  }
  // Enough epochs to cut num_samples samples of seq_length + 1 tokens
  // overlapping by one.
  int64_t total = 0;
  epochs_ = 0;
  do {
    ++epochs_;
    total += tokens_per_epoch;
  } while ((total - 1) / options_.seq_length < options_.num_samples);

  for (int64_t e = 0; e < epochs_; ++e) {
    std::vector<int32_t> order;
    for (int64_t s = first; s < last; ++s) order.push_back(static_cast<int32_t>(s));
    Shuffle(&order, options_.seed * 1000003 + e);
    doc_idx_.insert(doc_idx_.end(), order.begin(), order.end());
  }

  const int64_t n = options_.num_samples;
  sample_idx_.assign(2 * (n + 1), 0);
  int64_t doc_pos = 0, offset = 0;
  for (int64_t i = 1; i <= n; ++i) {
    int64_t remaining = options_.seq_length;  // next sample starts at this one's last token
    while (remaining > 0) {
      int64_t left = data_->sequence_length(doc_idx_[doc_pos]) - offset;
      if (left > remaining) {
        offset += remaining;
        remaining = 0;
      } else {
        remaining -= left;
        ++doc_pos;
        offset = 0;
      }
    }
    // Never point past the end of a document: "offset == length" is the
    // start of the next one.
    while (offset == data_->sequence_length(doc_idx_[doc_pos]) && doc_pos + 1 < int64_t(doc_idx_.size())) {
      ++doc_pos;
      offset = 0;
    }
    sample_idx_[2 * i] = doc_pos;
    sample_idx_[2 * i + 1] = offset;
  }

  shuffle_idx_.resize(n);
  for (int64_t i = 0; i < n; ++i) shuffle_idx_[i] = i;
  Shuffle(&shuffle_idx_, options_.seed * 1000003 + 999983);
  return absl::OkStatus();
}

absl::Status GptDataset::Sample(int64_t i, int32_t* out) const {
  return SampleTokens(i, 0, options_.seq_length + 1, out);
}

absl::Status GptDataset::SampleTokens(int64_t i, int64_t first, int64_t count,
                                      int32_t* out) const {
  if (i < 0 || i >= options_.num_samples) {
    return absl::OutOfRangeError(
        absl::StrCat("sample ", i, " outside the ", options_.num_samples, " built samples"));
  }
  if (first < 0 || count < 0 || first + count > options_.seq_length + 1) {
    return absl::OutOfRangeError(absl::StrCat("tokens [", first, ", ", first + count,
                                              ") outside a sample's ", options_.seq_length + 1));
  }
  const int64_t j = shuffle_idx_[i];
  int64_t doc_pos = sample_idx_[2 * j], offset = sample_idx_[2 * j + 1] + first;
  int64_t need = count;
  while (need > 0) {
    if (doc_pos >= int64_t(doc_idx_.size())) {
      return absl::InternalError("sample index runs past the document order");
    }
    const int32_t seq = doc_idx_[doc_pos];
    const int64_t length = data_->sequence_length(seq);
    if (offset >= length) {  // the skipped tokens end past this document
      offset -= length;
      ++doc_pos;
      continue;
    }
    int64_t take = std::min<int64_t>(need, length - offset);
    absl::Status s = data_->Read(seq, offset, take, out);
    if (!s.ok()) return s;
    out += take;
    need -= take;
    ++doc_pos;
    offset = 0;
  }
  return absl::OkStatus();
}

bool GptDataset::LoadCache(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 16 || std::memcmp(bytes.data(), kCacheMagic, 8) != 0) return false;
  std::memcpy(&epochs_, bytes.data() + 8, 8);
  size_t pos = 16;
  // A damaged cache is rebuilt rather than trusted.
  if (!ReadVec(bytes, &pos, &doc_idx_) || !ReadVec(bytes, &pos, &sample_idx_) ||
      !ReadVec(bytes, &pos, &shuffle_idx_) || pos != bytes.size() ||
      int64_t(shuffle_idx_.size()) != options_.num_samples ||
      int64_t(sample_idx_.size()) != 2 * (options_.num_samples + 1)) {
    doc_idx_.clear();
    sample_idx_.clear();
    shuffle_idx_.clear();
    return false;
  }
  return true;
}

absl::Status GptDataset::SaveCache(const std::string& path) const {
  std::string bytes(kCacheMagic, 8);
  bytes.append(reinterpret_cast<const char*>(&epochs_), 8);
  AppendVec(&bytes, doc_idx_);
  AppendVec(&bytes, sample_idx_);
  AppendVec(&bytes, shuffle_idx_);
  // Several ranks may build the same cache: each writes its own temporary
  // file and renames it, so readers only ever see a complete file.
  std::string tmp = absl::StrCat(path, ".tmp", std::random_device()());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write sample index cache ", tmp));
  }
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("writing sample index cache ", path, " failed"));
  }
  return absl::OkStatus();
}

int64_t SampleIndexFor(int64_t consumed_samples, int64_t micro_batch, int64_t micro_batch_size,
                       int64_t dp_rank, int64_t dp_size, int64_t row) {
  return consumed_samples + micro_batch * micro_batch_size * dp_size + dp_rank * micro_batch_size +
         row;
}

}  // namespace loom::train
