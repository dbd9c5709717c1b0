#include "comm/store/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/escaping.h"

namespace loom::comm {
namespace {

// Fixed context strings: a proof is bound to its role and to this protocol.
constexpr std::string_view kClientContext("loom tcp store v1: client proof", 31);
constexpr std::string_view kServerContext("loom tcp store v1: server proof", 31);

std::string Proof(std::string_view context, std::string_view secret,
                  std::string_view server_nonce, std::string_view client_nonce) {
  std::string msg;
  msg.reserve(context.size() + server_nonce.size() + client_nonce.size());
  msg.append(context);
  msg.append(server_nonce);
  msg.append(client_nonce);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // A zero-length key is valid for HMAC; Create refuses an empty secret
  // before any handshake, so it never happens here.
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), md, &len) == nullptr ||
      len != kStoreProofBytes) {
    return std::string();  // never equal to a real proof (StoreProofsEqual checks sizes)
  }
  return std::string(reinterpret_cast<const char*>(md), len);
}

}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("OpenSSL RAND_bytes failed: no random bytes for the TCP store");
  }
  return out;
}

absl::StatusOr<std::string> MakeRendezvousSecret() {
  absl::StatusOr<std::string> bytes = RandomBytes(32);
  if (!bytes.ok()) return bytes.status();
  return absl::BytesToHexString(*bytes);
}

std::string StoreClientProof(std::string_view secret, std::string_view server_nonce,
                             std::string_view client_nonce) {
  return Proof(kClientContext, secret, server_nonce, client_nonce);
}

std::string StoreServerProof(std::string_view secret, std::string_view server_nonce,
                             std::string_view client_nonce) {
  return Proof(kServerContext, secret, server_nonce, client_nonce);
}

bool StoreProofsEqual(std::string_view expected, std::string_view got) {
  if (expected.size() != kStoreProofBytes || got.size() != kStoreProofBytes) return false;
  return CRYPTO_memcmp(expected.data(), got.data(), kStoreProofBytes) == 0;
}

}  // namespace loom::comm
