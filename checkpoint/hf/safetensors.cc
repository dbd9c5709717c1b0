#include "checkpoint/hf/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_util.h"
#include "checkpoint/hf/json_util.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

namespace loom::checkpoint::hf {
namespace {

using nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";
// A header bigger than this is not a model header (the Rust reader's limit).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// numel x element size, or -1 on overflow.
int64_t ByteSize(const std::vector<int64_t>& shape, Dtype dtype) {
  int64_t n = static_cast<int64_t>(DtypeSize(dtype));
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

// An open file with its size, closed on destruction.
class File {
 public:
  static absl::StatusOr<File> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
      return ErrnoError("cannot open", path);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      absl::Status s = ErrnoError("cannot stat", path);
      ::close(fd);
      return s;
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": is a folder, not a .safetensors file"));
    }
    return File(fd, static_cast<uint64_t>(st.st_size));
  }
  File(File&& o) noexcept : fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t size() const { return size_; }

  // Exactly `n` bytes at `offset` into `out`.
  absl::Status ReadAt(uint64_t offset, size_t n, char* out, const std::string& path) const {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("cannot read", path);
      }
      if (r == 0) {
        return absl::DataLossError(absl::StrCat(path, ": truncated: the file ended at byte ",
                                                offset + done, " while reading ", n,
                                                " bytes at ", offset));
      }
      done += static_cast<size_t>(r);
    }
    return absl::OkStatus();
  }

 private:
  File(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct Entry {
  NamedTensor tensor;  // data empty
  uint64_t begin = 0, end = 0;  // relative to the data section
};

struct Header {
  std::vector<Entry> entries;  // by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;     // absolute file offset of the data section
};

absl::StatusOr<Header> ParseHeader(const File& file, const std::string& path) {
  if (file.size() < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", file.size(),
                                            " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  LOOM_RETURN_IF_ERROR(file.ReadAt(0, 8, reinterpret_cast<char*>(&n), path));
  if (n > file.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: the header length says ", n,
                                            " bytes but only ", file.size() - 8,
                                            " follow the 8-byte length"));
  }
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", n, " is over the limit of ", kMaxHeaderBytes,
                     " bytes: not a safetensors file?"));
  }
  std::string text(n, '\0');
  LOOM_RETURN_IF_ERROR(file.ReadAt(8, n, text.data(), path));
  LOOM_ASSIGN_OR_RETURN(json header, ParseJsonStrict(text, path, "safetensors header"));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad header JSON: expected an object, got ", header.type_name()));
  }
  Header out;
  out.data_start = 8 + n;
  const uint64_t data_size = file.size() - out.data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": bad header JSON: __metadata__ is not an object"));
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": bad header JSON: __metadata__[\"", m.key(), "\"] is not a string"));
        }
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat(path, ": tensor '", name, "'");
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": bad header JSON: expected {\"dtype\", \"shape\", \"data_offsets\"}, got ",
          v.dump()));
    }
    if (!v["dtype"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": dtype is not a string"));
    }
    absl::StatusOr<Dtype> dtype = ParseDtype(v["dtype"].get<std::string>());
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", dtype.status().message()));
    Entry e;
    e.tensor.name = name;
    e.tensor.dtype = *dtype;
    if (!v["shape"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": shape is not a list"));
    }
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": shape ", v["shape"].dump(), " is not a list of sizes"));
      }
      e.tensor.shape.push_back(d.get<int64_t>());
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": data_offsets ", off.dump(), " is not [begin, end]"));
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": data_offsets [", e.begin, ", ", e.end, "] end before begin"));
    }
    const int64_t bytes = ByteSize(e.tensor.shape, e.tensor.dtype);
    if (bytes < 0 || static_cast<uint64_t>(bytes) != e.end - e.begin) {
      return absl::DataLossError(absl::StrCat(
          where, ": data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
          " bytes but ", DtypeName(e.tensor.dtype), ShapeString(e.tensor.shape), " needs ", bytes));
    }
    if (e.end > data_size) {
      return absl::DataLossError(absl::StrCat(
          where, ": truncated: data_offsets [", e.begin, ", ", e.end,
          "] run past the end of the data (", data_size, " bytes after the header)"));
    }
    out.entries.push_back(std::move(e));
  }
  std::sort(out.entries.begin(), out.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < out.entries.size(); ++i) {
    const Entry& a = out.entries[i - 1];
    const Entry& b = out.entries[i];
    if (b.begin < a.end) {
      return absl::DataLossError(absl::StrCat(path, ": tensors '", a.tensor.name, "' [", a.begin,
                                              ", ", a.end, ") and '", b.tensor.name, "' [",
                                              b.begin, ", ", b.end, ") overlap"));
    }
  }
  return out;
}

void WidenToF32(NamedTensor& t) {
  if (t.dtype != Dtype::kBF16 && t.dtype != Dtype::kF16) return;
  const int64_t n = t.numel();
  std::string out(static_cast<size_t>(n) * sizeof(float), '\0');
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, t.data.data() + 2 * i, 2);
    const float f = t.dtype == Dtype::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
  t.data = std::move(out);
  t.dtype = Dtype::kF32;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

const char* DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return "F32";
    case Dtype::kBF16: return "BF16";
    case Dtype::kF16: return "F16";
    case Dtype::kI64: return "I64";
  }
  return "?";
}

size_t DtypeSize(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return 4;
    case Dtype::kBF16: return 2;
    case Dtype::kF16: return 2;
    case Dtype::kI64: return 8;
  }
  return 0;
}

absl::StatusOr<Dtype> ParseDtype(const std::string& name) {
  for (Dtype d : {Dtype::kF32, Dtype::kBF16, Dtype::kF16, Dtype::kI64}) {
    if (name == DtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (Loom reads F32, BF16, F16, I64)"));
}

float Bf16ToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;  // +-0
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

int64_t NamedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<float>> NamedTensor::ToF32() const {
  if (dtype == Dtype::kI64) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is I64, not a float"));
  }
  const int64_t n = numel();
  if (data.size() != static_cast<size_t>(n) * DtypeSize(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", data.size(),
                                                   " bytes for ", DtypeName(dtype),
                                                   ShapeString(shape)));
  }
  std::vector<float> out(static_cast<size_t>(n));
  if (dtype == Dtype::kF32) {
    if (n > 0) std::memcpy(out.data(), data.data(), data.size());
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + 2 * i, 2);
    out[i] = dtype == Dtype::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
  }
  return out;
}

NamedTensor NamedTensor::FromF32(std::string name, std::vector<int64_t> shape,
                                 const std::vector<float>& values) {
  NamedTensor t;
  t.name = std::move(name);
  t.dtype = Dtype::kF32;
  t.shape = std::move(shape);
  t.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return t;
}

const NamedTensor* TensorSet::Find(const std::string& name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<std::string> TensorSet::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (const NamedTensor& t : tensors) names.push_back(t.name);
  return names;
}

absl::StatusOr<TensorSet> ReadSafetensorsHeader(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(File file, File::Open(path));
  LOOM_ASSIGN_OR_RETURN(Header header, ParseHeader(file, path));
  TensorSet out;
  out.metadata = std::move(header.metadata);
  for (Entry& e : header.entries) out.tensors.push_back(std::move(e.tensor));
  return out;
}

absl::StatusOr<TensorSet> ReadSafetensors(const std::string& path, const ReadOptions& options) {
  LOOM_ASSIGN_OR_RETURN(File file, File::Open(path));
  LOOM_ASSIGN_OR_RETURN(Header header, ParseHeader(file, path));
  TensorSet out;
  out.metadata = std::move(header.metadata);
  out.tensors.reserve(header.entries.size());
  for (Entry& e : header.entries) {
    NamedTensor t = std::move(e.tensor);
    t.data.resize(e.end - e.begin);
    LOOM_RETURN_IF_ERROR(file.ReadAt(header.data_start + e.begin, t.data.size(), t.data.data(), path));
    if (options.to_f32) WidenToF32(t);
    out.tensors.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<TensorSet> ReadShardedSafetensors(const std::string& index_path,
                                                 const ReadOptions& options) {
  absl::StatusOr<std::string> text = ReadFile(index_path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat(index_path, ": no such file"));
    }
    return text.status();
  }
  LOOM_ASSIGN_OR_RETURN(json index, ParseJsonStrict(*text, index_path, "index"));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": bad index JSON: no \"weight_map\" object"));
  }
  // shard file -> names the index puts there.
  std::map<std::string, std::set<std::string>> by_shard;
  const json& weight_map = index["weight_map"];
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"", it.key(),
                                                     "\"] is not a file name"));
    }
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard[0] == '/' || shard.find("..") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"", it.key(),
                                                     "\"] = \"", shard,
                                                     "\" is not a file name in the folder"));
    }
    by_shard[shard].insert(it.key());
  }
  if (by_shard.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));
  }
  const std::string dir = DirName(index_path);
  TensorSet out;
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = JoinPath(dir, shard);
    absl::StatusOr<TensorSet> part = ReadSafetensors(shard_path, options);
    if (!part.ok()) {
      if (absl::IsNotFound(part.status())) {
        return absl::NotFoundError(absl::StrCat(index_path, ": shard ", shard_path, " (of ",
                                                names.size(), " tensors, e.g. '", *names.begin(),
                                                "') is missing"));
      }
      return part.status();
    }
    std::set<std::string> seen;
    for (NamedTensor& t : part->tensors) {
      if (names.count(t.name) == 0) {
        const auto where = weight_map.find(t.name);
        return absl::InvalidArgumentError(absl::StrCat(
            shard_path, ": holds '", t.name, "' which ", index_path,
            where == weight_map.end() ? std::string(" does not list")
                                      : absl::StrCat(" maps to ", where->get<std::string>())));
      }
      seen.insert(t.name);
      out.tensors.push_back(std::move(t));
    }
    for (const std::string& name : names) {
      if (seen.count(name) == 0) {
        return absl::NotFoundError(absl::StrCat(index_path, ": tensor '", name,
                                                "' is listed in the index but absent from its shard ",
                                                shard_path));
      }
    }
    for (auto& [k, v] : part->metadata) out.metadata.emplace(k, v);
  }
  return out;
}

absl::StatusOr<TensorSet> ReadSafetensorsDir(const std::string& dir, const ReadOptions& options) {
  const std::string index = JoinPath(dir, kIndexName);
  if (PathExists(index)) return ReadShardedSafetensors(index, options);
  const std::string single = JoinPath(dir, kSingleName);
  if (PathExists(single)) return ReadSafetensors(single, options);
  return absl::NotFoundError(
      absl::StrCat(dir, ": neither ", kIndexName, " nor ", kSingleName, " is there"));
}

absl::StatusOr<std::string> SerializeSafetensors(const std::vector<NamedTensor>& tensors,
                                                 const WriteOptions& options) {
  if (options.float_dtype != Dtype::kF32 && options.float_dtype != Dtype::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors writer: float dtype ",
                                                   DtypeName(options.float_dtype),
                                                   " is not supported (F32 or BF16)"));
  }
  std::set<std::string> names;
  std::vector<Dtype> stored(tensors.size());
  nlohmann::ordered_json header;  // keys in `tensors` order, as the data
  header["__metadata__"] = nlohmann::ordered_json::object();
  if (options.metadata.empty()) {
    header["__metadata__"]["format"] = "pt";
  } else {
    for (const auto& [k, v] : options.metadata) header["__metadata__"][k] = v;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer: bad tensor name '", t.name, "'"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer: tensor name '", t.name, "' appears twice"));
    }
    const int64_t bytes = ByteSize(t.shape, t.dtype);
    if (bytes < 0 || static_cast<uint64_t>(bytes) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors writer: tensor '", t.name,
                                                     "' has ", t.data.size(), " bytes for ",
                                                     DtypeName(t.dtype), ShapeString(t.shape)));
    }
    stored[i] = t.dtype == Dtype::kI64 ? Dtype::kI64 : options.float_dtype;
    const uint64_t out_bytes = static_cast<uint64_t>(t.numel()) * DtypeSize(stored[i]);
    header[t.name] = {{"dtype", DtypeName(stored[i])},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + out_bytes}}};
    offset += out_bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // 8 + header: data starts 8-byte aligned
  std::string file;
  file.reserve(8 + text.size() + offset);
  const uint64_t n = text.size();
  file.append(reinterpret_cast<const char*>(&n), 8);
  file += text;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& t = tensors[i];
    if (stored[i] == t.dtype) {
      file += t.data;
      continue;
    }
    const int64_t count = t.numel();
    LOOM_ASSIGN_OR_RETURN(std::vector<float> values, t.ToF32());
    if (stored[i] == Dtype::kF32) {
      file.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    } else {  // BF16
      std::string out(static_cast<size_t>(count) * 2, '\0');
      for (int64_t j = 0; j < count; ++j) {
        const uint16_t b = F32ToBf16(values[j]);
        std::memcpy(out.data() + 2 * j, &b, 2);
      }
      file += out;
    }
  }
  return file;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const WriteOptions& options) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, options);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), absl::StrCat(path, ": ", bytes.status().message()));
  }
  const std::string dir = DirName(path);
  if (!dir.empty()) LOOM_RETURN_IF_ERROR(MakeDirs(dir));
  return WriteFileAtomically(path, *bytes);
}

}  // namespace loom::checkpoint::hf
