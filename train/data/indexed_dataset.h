#ifndef LOOM_TRAIN_DATA_INDEXED_DATASET_H_
#define LOOM_TRAIN_DATA_INDEXED_DATASET_H_

// Megatron's indexed dataset (<prefix>.bin + <prefix>.idx), byte-compatible
// with files written by Megatron-LM's tools/preprocess_data.py. Layout (all
// little-endian, no padding) in docs/PARALLELISM.md:
//   .idx: "MMIDIDX\0\0" | u64 version=1 | u8 dtype code | u64 S | u64 D |
//         i32[S] sequence lengths | i64[S] byte offsets into .bin | i64[D] doc index
//   .bin: the raw token array.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::train {

// Megatron's dtype codes, as stored in the .idx header.
enum class TokenType : uint8_t {
  kU8 = 1,
  kI8 = 2,
  kI16 = 3,
  kI32 = 4,
  kI64 = 5,
  kF64 = 6,
  kF32 = 7,
  kU16 = 8,
};
size_t TokenTypeSize(TokenType type);
// What Megatron picks: u16 when the vocabulary fits (< 65500), else i32.
TokenType TokenTypeForVocab(int64_t vocab_size);

// Writes a dataset. The .bin is streamed; the .idx is written by Finalize().
// Both are written under temporary names and renamed into place only when
// complete, so a crash never leaves a half-written dataset behind.
// Writes <prefix>.idx in Megatron's layout (magic, version, token type,
// sizes, pointers, document index) for sequences of these lengths stored back
// to back in <prefix>.bin, so the pointers follow from the lengths; doc_index
// starts at 0 and ends at lengths.size(). Atomic (a temporary file renamed).
// The one writer of the format: IndexedDatasetWriter::Finalize and the blend
// bench's synthetic corpora call it.
absl::Status WriteIndexFile(const std::string& prefix, TokenType type,
                            const std::vector<int32_t>& lengths,
                            const std::vector<int64_t>& doc_index);

class IndexedDatasetWriter {
 public:
  static absl::StatusOr<std::unique_ptr<IndexedDatasetWriter>> Create(const std::string& prefix,
                                                                      TokenType type);
  ~IndexedDatasetWriter();

  // Appends one sequence (Megatron: one document, or one sentence of it).
  // Tokens must fit the token type.
  absl::Status AddSequence(const int32_t* tokens, size_t count);
  // Marks the end of the current document (a document is >= 1 sequences).
  absl::Status EndDocument();
  absl::Status Finalize();

  size_t num_sequences() const { return lengths_.size(); }

 private:
  IndexedDatasetWriter(std::string prefix, TokenType type, std::FILE* bin);
  std::string prefix_;
  TokenType type_;
  std::FILE* bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_index_{0};
  bool finalized_ = false;
};

// A read-only, memory-mapped dataset.
class IndexedDataset {
 public:
  // Opens and validates <prefix>.idx and <prefix>.bin; errors name the file
  // and what was wrong (magic, version, dtype, sizes, offsets).
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  TokenType token_type() const { return type_; }
  size_t num_sequences() const { return num_sequences_; }
  size_t num_documents() const { return doc_index_.size() - 1; }
  int32_t sequence_length(size_t i) const { return lengths_[i]; }
  // Sequence ids where documents start: size num_documents() + 1, last = S.
  const std::vector<int64_t>& document_index() const { return doc_index_; }
  const std::vector<int32_t>& sequence_lengths() const { return lengths_; }
  int64_t total_tokens() const;

  // Copies tokens [offset, offset + count) of sequence `seq` as int32.
  absl::Status Read(size_t seq, size_t offset, size_t count, int32_t* out) const;

 private:
  IndexedDataset() = default;
  std::string bin_path_;
  TokenType type_ = TokenType::kU16;
  size_t num_sequences_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> doc_index_;
  const uint8_t* bin_ = nullptr;
  size_t bin_size_ = 0;
};

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_INDEXED_DATASET_H_
