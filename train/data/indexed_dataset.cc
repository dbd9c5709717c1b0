#include "train/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace loom::train {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // 34

bool ValidTokenType(uint8_t code) { return code >= 1 && code <= 8; }

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // .idx arrays are not aligned
  return v;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("writing ", path, " failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

size_t TokenTypeSize(TokenType type) {
  switch (type) {
    case TokenType::kU8:
    case TokenType::kI8:
      return 1;
    case TokenType::kI16:
    case TokenType::kU16:
      return 2;
    case TokenType::kI32:
    case TokenType::kF32:
      return 4;
    case TokenType::kI64:
    case TokenType::kF64:
      return 8;
  }
  return 0;
}

TokenType TokenTypeForVocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenType::kU16 : TokenType::kI32;
}

// ---------------------------------------------------------------- writer

absl::Status WriteIndexFile(const std::string& prefix, TokenType type,
                            const std::vector<int32_t>& lengths,
                            const std::vector<int64_t>& doc_index) {
  if (doc_index.empty() || doc_index.front() != 0 ||
      doc_index.back() != static_cast<int64_t>(lengths.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteIndexFile for ", prefix, ": the document index must run from 0 to the ",
        lengths.size(), " sequences"));
  }
  std::string idx(kMagic, sizeof(kMagic));
  Append<uint64_t>(&idx, kVersion);
  Append<uint8_t>(&idx, static_cast<uint8_t>(type));
  Append<uint64_t>(&idx, lengths.size());
  Append<uint64_t>(&idx, doc_index.size());
  for (int32_t l : lengths) Append<int32_t>(&idx, l);
  const int64_t width = static_cast<int64_t>(TokenTypeSize(type));
  int64_t offset = 0;
  for (int32_t l : lengths) {
    Append<int64_t>(&idx, offset);
    offset += int64_t{l} * width;
  }
  for (int64_t d : doc_index) Append<int64_t>(&idx, d);
  return WriteFileAtomically(prefix + ".idx", idx);
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenType type, std::FILE* bin)
    : prefix_(std::move(prefix)), type_(type), bin_(bin) {}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_ != nullptr) std::fclose(bin_);
  if (!finalized_) std::remove((prefix_ + ".bin.tmp").c_str());
}

absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> IndexedDatasetWriter::Create(
    const std::string& prefix, TokenType type) {
  if (type != TokenType::kU8 && type != TokenType::kU16 && type != TokenType::kI32 &&
      type != TokenType::kI64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IndexedDatasetWriter for ", prefix, ": token type code ", static_cast<int>(type),
        " is not an integer type (expected u8, u16, i32 or i64)"));
  }
  // A new --output-prefix folder (data/my_corpus) is made, as a user expects.
  const std::filesystem::path folder = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create the folder ", folder.string(),
                                                    " (from --output-prefix): ", ec.message()));
  }
  std::string tmp = prefix + ".bin.tmp";
  std::FILE* bin = std::fopen(tmp.c_str(), "wb");
  if (bin == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, " (from --output-prefix): ", std::strerror(errno)));
  }
  return std::unique_ptr<IndexedDatasetWriter>(new IndexedDatasetWriter(prefix, type, bin));
}

absl::Status IndexedDatasetWriter::AddSequence(const int32_t* tokens, size_t count) {
  if (finalized_) return absl::FailedPreconditionError("AddSequence after Finalize");
  const size_t width = TokenTypeSize(type_);
  const int64_t max = type_ == TokenType::kU8    ? 255
                      : type_ == TokenType::kU16 ? 65535
                                                 : INT32_MAX;
  std::string buf;
  buf.reserve(count * width);
  for (size_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || tokens[i] > max) {
      return absl::OutOfRangeError(absl::StrCat("token ", tokens[i], " at position ", i,
                                                " does not fit the dataset's token type (max ",
                                                max, ")"));
    }
    switch (type_) {
      case TokenType::kU8:
        Append<uint8_t>(&buf, static_cast<uint8_t>(tokens[i]));
        break;
      case TokenType::kU16:
        Append<uint16_t>(&buf, static_cast<uint16_t>(tokens[i]));
        break;
      case TokenType::kI64:
        Append<int64_t>(&buf, tokens[i]);
        break;
      default:
        Append<int32_t>(&buf, tokens[i]);
    }
  }
  if (std::fwrite(buf.data(), 1, buf.size(), bin_) != buf.size()) {
    return absl::DataLossError(
        absl::StrCat("writing ", prefix_, ".bin.tmp failed: ", std::strerror(errno)));
  }
  lengths_.push_back(static_cast<int32_t>(count));
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::EndDocument() {
  if (static_cast<int64_t>(lengths_.size()) == doc_index_.back()) {
    return absl::FailedPreconditionError("EndDocument with no sequence since the last one");
  }
  doc_index_.push_back(static_cast<int64_t>(lengths_.size()));
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::Finalize() {
  if (finalized_) return absl::FailedPreconditionError("Finalize called twice");
  if (doc_index_.back() != static_cast<int64_t>(lengths_.size())) {
    doc_index_.push_back(static_cast<int64_t>(lengths_.size()));  // close the last document
  }
  bool ok = std::fflush(bin_) == 0;
  ok = fsync(fileno(bin_)) == 0 && ok;
  ok = std::fclose(bin_) == 0 && ok;
  bin_ = nullptr;
  if (!ok) return absl::DataLossError(absl::StrCat("writing ", prefix_, ".bin.tmp failed"));

  if (std::rename((prefix_ + ".bin.tmp").c_str(), (prefix_ + ".bin").c_str()) != 0) {
    return absl::DataLossError(
        absl::StrCat("renaming ", prefix_, ".bin.tmp failed: ", std::strerror(errno)));
  }
  finalized_ = true;
  // The .idx goes last: a dataset with an .idx is complete.
  return WriteIndexFile(prefix_, type_, lengths_, doc_index_);
}

// ---------------------------------------------------------------- reader

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::Open(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx";
  std::ifstream in(idx_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", idx_path,
                                            ": expected a Megatron indexed dataset (.idx/.bin) "
                                            "made by //train:preprocess_data (--data-path)"));
  }
  std::string idx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(idx_path, ": ", what));
  };
  if (idx.size() < kHeaderBytes || std::memcmp(idx.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("bad magic: not a Megatron indexed dataset index (expected MMIDIDX)");
  }
  const char* p = idx.data() + 9;
  uint64_t version = Load<uint64_t>(p);
  if (version != kVersion) {
    return bad(absl::StrCat("version ", version, " is not supported (expected 1)"));
  }
  uint8_t code = Load<uint8_t>(p + 8);
  if (!ValidTokenType(code)) return bad(absl::StrCat("unknown dtype code ", int{code}));
  uint64_t s = Load<uint64_t>(p + 9);
  uint64_t d = Load<uint64_t>(p + 17);
  const uint64_t expected = kHeaderBytes + 12 * s + 8 * d;
  if (s > idx.size() || d > idx.size() || idx.size() != expected || d < 1) {
    return bad(absl::StrCat("size ", idx.size(), " bytes does not match S=", s, ", D=", d,
                            " (expected ", expected, "): truncated or corrupt"));
  }
  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->type_ = static_cast<TokenType>(code);
  ds->num_sequences_ = s;
  ds->lengths_.resize(s);
  ds->offsets_.resize(s);
  ds->doc_index_.resize(d);
  const char* q = idx.data() + kHeaderBytes;
  for (uint64_t i = 0; i < s; ++i) ds->lengths_[i] = Load<int32_t>(q + 4 * i);
  q += 4 * s;
  for (uint64_t i = 0; i < s; ++i) ds->offsets_[i] = Load<int64_t>(q + 8 * i);
  q += 8 * s;
  for (uint64_t i = 0; i < d; ++i) ds->doc_index_[i] = Load<int64_t>(q + 8 * i);
  if (ds->doc_index_.front() != 0 || ds->doc_index_.back() != static_cast<int64_t>(s)) {
    return bad("document index must start at 0 and end at the number of sequences");
  }
  for (uint64_t i = 1; i < d; ++i) {
    if (ds->doc_index_[i] < ds->doc_index_[i - 1]) return bad("document index is not sorted");
  }

  ds->bin_path_ = prefix + ".bin";
  int fd = ::open(ds->bin_path_.c_str(), O_RDONLY);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", ds->bin_path_, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("fstat ", ds->bin_path_, " failed"));
  }
  ds->bin_size_ = static_cast<size_t>(st.st_size);
  const size_t width = TokenTypeSize(ds->type_);
  for (uint64_t i = 0; i < s; ++i) {
    if (ds->lengths_[i] < 0 || ds->offsets_[i] < 0 ||
        static_cast<uint64_t>(ds->offsets_[i]) + uint64_t(ds->lengths_[i]) * width >
            ds->bin_size_) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(
          ds->bin_path_, ": sequence ", i, " (offset ", ds->offsets_[i], ", ", ds->lengths_[i],
          " tokens) lies past the end of the file (", ds->bin_size_, " bytes): truncated?"));
    }
  }
  if (ds->bin_size_ > 0) {
    void* map = mmap(nullptr, ds->bin_size_, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("mmap ", ds->bin_path_, " failed: ", std::strerror(errno)));
    }
    ds->bin_ = static_cast<const uint8_t*>(map);
  }
  ::close(fd);
  return ds;
}

IndexedDataset::~IndexedDataset() {
  if (bin_ != nullptr) munmap(const_cast<uint8_t*>(bin_), bin_size_);
}

int64_t IndexedDataset::total_tokens() const {
  int64_t n = 0;
  for (int32_t l : lengths_) n += l;
  return n;
}

absl::Status IndexedDataset::Read(size_t seq, size_t offset, size_t count, int32_t* out) const {
  if (seq >= num_sequences_ || offset + count > static_cast<size_t>(lengths_[seq])) {
    return absl::OutOfRangeError(absl::StrCat("Read(sequence ", seq, ", offset ", offset,
                                              ", count ", count, ") outside ", bin_path_));
  }
  const size_t width = TokenTypeSize(type_);
  const uint8_t* p = bin_ + offsets_[seq] + offset * width;
  for (size_t i = 0; i < count; ++i, p += width) {
    switch (type_) {
      case TokenType::kU8:
        out[i] = *p;
        break;
      case TokenType::kI8:
        out[i] = Load<int8_t>(reinterpret_cast<const char*>(p));
        break;
      case TokenType::kI16:
        out[i] = Load<int16_t>(reinterpret_cast<const char*>(p));
        break;
      case TokenType::kU16:
        out[i] = Load<uint16_t>(reinterpret_cast<const char*>(p));
        break;
      case TokenType::kI32:
        out[i] = Load<int32_t>(reinterpret_cast<const char*>(p));
        break;
      case TokenType::kI64:
        out[i] = static_cast<int32_t>(Load<int64_t>(reinterpret_cast<const char*>(p)));
        break;
      case TokenType::kF32:
        out[i] = static_cast<int32_t>(Load<float>(reinterpret_cast<const char*>(p)));
        break;
      case TokenType::kF64:
        out[i] = static_cast<int32_t>(Load<double>(reinterpret_cast<const char*>(p)));
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace loom::train
