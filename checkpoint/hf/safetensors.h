#ifndef LOOM_CHECKPOINT_HF_SAFETENSORS_H_
#define LOOM_CHECKPOINT_HF_SAFETENSORS_H_

// The safetensors format (Hugging Face): a u64 little-endian header length N,
// N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]}, ..., "__metadata__": {"k": "v"}}, then the raw little-endian
// tensor data (offsets are relative to the end of the header).
//
// A sharded checkpoint is a folder with model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {"name": "model-00001-of-00002.safetensors"}})
// next to its shards; an unsharded one has model.safetensors.
//
// Tensors are plain named byte buffers (NamedTensor), independent of
// core::Tensor, so that reading and writing does not depend on a device or on
// the model code. Every error names the file as given and what was wrong.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::checkpoint::hf {

// Element types Loom reads. BF16 and F16 widen to F32 on request; I64 (token
// ids, position ids) is kept as is.
enum class Dtype { kF32, kBF16, kF16, kI64 };

const char* DtypeName(Dtype dtype);  // "F32", "BF16", "F16", "I64" (safetensors spelling)
size_t DtypeSize(Dtype dtype);
// InvalidArgument for any other safetensors dtype ("F64", "F8_E4M3", ...).
absl::StatusOr<Dtype> ParseDtype(const std::string& name);

// bf16 <-> f32: widening is exact; narrowing rounds to nearest even and keeps
// NaN a (quiet) NaN, as torch's .to(torch.bfloat16) does.
float Bf16ToF32(uint16_t bits);
uint16_t F32ToBf16(float x);
// IEEE half -> f32 (exact, subnormals, inf and NaN included).
float F16ToF32(uint16_t bits);

struct NamedTensor {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;  // [] is a scalar (one element)
  std::string data;            // numel() * DtypeSize(dtype) little-endian bytes

  int64_t numel() const;
  // The values as f32 (F32 copied, BF16/F16 widened); InvalidArgument for I64.
  absl::StatusOr<std::vector<float>> ToF32() const;

  static NamedTensor FromF32(std::string name, std::vector<int64_t> shape,
                             const std::vector<float>& values);
};

// The tensors of one file or of a whole (possibly sharded) checkpoint.
struct TensorSet {
  std::vector<NamedTensor> tensors;  // file order (by data offset); shard order for a set
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values)

  // nullptr when absent.
  const NamedTensor* Find(const std::string& name) const;
  std::vector<std::string> Names() const;  // in `tensors` order
};

struct ReadOptions {
  // Widen BF16 and F16 tensors to F32 while reading (I64 stays I64).
  bool to_f32 = false;
};

// One .safetensors file. Errors: NotFound (missing file), DataLoss (truncated
// file, header length or data offsets past the end, overlapping tensors, a
// byte size that does not match dtype x shape), InvalidArgument (bad header
// JSON, unknown dtype, duplicated tensor names, malformed entries).
absl::StatusOr<TensorSet> ReadSafetensors(const std::string& path, const ReadOptions& options = {});

// Only the header: names, dtypes, shapes (NamedTensor::data left empty) and
// metadata, with the same checks on offsets against the file size.
absl::StatusOr<TensorSet> ReadSafetensorsHeader(const std::string& path);

// A sharded checkpoint from its index (model.safetensors.index.json): every
// tensor in the weight_map is read from its shard. Errors name the index and
// the shard: a missing shard, a tensor listed in the index but absent from
// its shard, a shard holding a tensor the index does not list or maps
// elsewhere, duplicated names in the weight_map. Tensors come in shard order
// (sorted shard names), then file order.
absl::StatusOr<TensorSet> ReadShardedSafetensors(const std::string& index_path,
                                                 const ReadOptions& options = {});

// A Hugging Face model folder: model.safetensors.index.json if present, else
// model.safetensors; NotFound naming the folder when neither is there.
absl::StatusOr<TensorSet> ReadSafetensorsDir(const std::string& dir,
                                             const ReadOptions& options = {});

struct WriteOptions {
  // Floating tensors (F32, BF16, F16) are stored as this dtype: kF32 or kBF16
  // (F32 -> BF16 rounds to nearest even). I64 tensors are stored as they are.
  Dtype float_dtype = Dtype::kF32;
  // Written as "__metadata__"; {"format": "pt"} (what transformers expects)
  // when empty.
  std::map<std::string, std::string> metadata;
};

// Writes `tensors` in the given order to `path` (atomically: path.tmp, fsync,
// rename). The header is padded with spaces so the data starts 8-byte
// aligned. InvalidArgument for duplicated names, a data size that does not
// match dtype x shape, or float_dtype other than kF32/kBF16.
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const WriteOptions& options = {});

// The bytes WriteSafetensors writes (for callers that write elsewhere).
absl::StatusOr<std::string> SerializeSafetensors(const std::vector<NamedTensor>& tensors,
                                                 const WriteOptions& options = {});

}  // namespace loom::checkpoint::hf

#endif  // LOOM_CHECKPOINT_HF_SAFETENSORS_H_
