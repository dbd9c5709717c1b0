#ifndef LOOM_COMM_STORE_AUTH_H_
#define LOOM_COMM_STORE_AUTH_H_

// The TCP store's handshake: before rank 0's store reads a single request,
// client and server each prove that they know the job's secret, by an
// HMAC-SHA-256 over fresh random nonces (OpenSSL's libcrypto). Neither the
// secret nor anything from which it can be computed offline more cheaply than
// by guessing goes over the wire, and a recorded handshake is useless later:
// the server's nonce is new for every connection.
//
//   server -> client  hello    magic "LOOMST1\0" (8)  server_nonce (32)
//   client -> server  answer   magic (8)  client_nonce (32)
//                              HMAC(secret, kClientContext || server_nonce || client_nonce) (32)
//   server -> client  verdict  1 byte: 0 accepted, then
//                              HMAC(secret, kServerContext || server_nonce || client_nonce) (32);
//                              1 refused (wrong secret), then the server closes.
//
// The client checks the server's proof too (mutual authentication): a
// process that took rank 0's port without the secret cannot hand out
// addresses. The two proofs use different context strings, so one side's
// proof can never be reflected back as the other's.

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace loom::comm {

inline constexpr size_t kStoreNonceBytes = 32;
inline constexpr size_t kStoreProofBytes = 32;  // SHA-256
inline constexpr char kStoreMagic[8] = {'L', 'O', 'O', 'M', 'S', 'T', '1', '\0'};
inline constexpr size_t kStoreHelloBytes = 8 + kStoreNonceBytes;
inline constexpr size_t kStoreAnswerBytes = 8 + kStoreNonceBytes + kStoreProofBytes;
inline constexpr unsigned char kStoreAccepted = 0;
inline constexpr unsigned char kStoreRefused = 1;

// `n` bytes from OpenSSL's RAND_bytes (a CSPRNG); an error if it fails.
absl::StatusOr<std::string> RandomBytes(size_t n);

// A new job secret: 32 random bytes as 64 hex digits (what `openssl rand -hex
// 32` prints). The launcher makes one per job and gives it to its ranks as
// LOOM_RENDEZVOUS_SECRET.
absl::StatusOr<std::string> MakeRendezvousSecret();

// The proofs (kStoreProofBytes each) of the handshake above.
std::string StoreClientProof(std::string_view secret, std::string_view server_nonce,
                             std::string_view client_nonce);
std::string StoreServerProof(std::string_view secret, std::string_view server_nonce,
                             std::string_view client_nonce);

// Constant-time comparison (CRYPTO_memcmp) of two proofs; false if the
// sizes differ.
bool StoreProofsEqual(std::string_view expected, std::string_view got);

}  // namespace loom::comm

#endif  // LOOM_COMM_STORE_AUTH_H_
