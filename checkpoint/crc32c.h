#ifndef LOOM_CHECKPOINT_CRC32C_H_
#define LOOM_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace loom::checkpoint {

// CRC-32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected),
// as in RFC 3720. Extend() continues a running checksum:
//   Crc32c(a + b) == Crc32cExtend(Crc32c(a), b).
// Uses the SSE4.2 crc32 instruction when the CPU has it, else a table.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// The CRC of A+B from crc(A), crc(B) and |B| (zlib's crc32_combine):
// lets independent chunks be checksummed in parallel and merged.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, size_t len_b);

// The portable table implementation (the oracle the fast path is tested against).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace loom::checkpoint

#endif  // LOOM_CHECKPOINT_CRC32C_H_
