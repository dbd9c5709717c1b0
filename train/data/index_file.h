#ifndef LOOM_TRAIN_DATA_INDEX_FILE_H_
#define LOOM_TRAIN_DATA_INDEX_FILE_H_

// The vectors of a cached index file (the sample index, a blend's indices):
// a little-endian u64 count, then the elements' bytes. The cache is read back
// by the machine that wrote it, so the elements are stored as they are in
// memory.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace loom::train {

template <typename T>
void AppendVec(std::string* out, const std::vector<T>& v) {
  uint64_t n = v.size();
  out->append(reinterpret_cast<const char*>(&n), 8);
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Reads the vector at *pos and moves *pos past it; false if `in` is too short
// for the count it holds (a truncated or foreign file).
template <typename T>
bool ReadVec(const std::string& in, size_t* pos, std::vector<T>* v) {
  uint64_t n;
  if (*pos + 8 > in.size()) return false;
  std::memcpy(&n, in.data() + *pos, 8);
  *pos += 8;
  if (n > (in.size() - *pos) / sizeof(T)) return false;
  v->resize(n);
  std::memcpy(v->data(), in.data() + *pos, n * sizeof(T));
  *pos += n * sizeof(T);
  return true;
}

}  // namespace loom::train

#endif  // LOOM_TRAIN_DATA_INDEX_FILE_H_
