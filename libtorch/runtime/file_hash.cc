#include "libtorch/runtime/file_hash.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "planner/base/error.h"

namespace ckplan {
namespace {

// A SHA-256 digest being computed (libcrypto picks the CPU's SHA
// instructions where it has them).
class Sha256 {
 public:
  Sha256() : context_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (!context_ || EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) != 1) Fail();
  }
  void Update(const void* data, size_t size) {
    if (size > 0 && EVP_DigestUpdate(context_.get(), data, size) != 1) Fail();
  }
  std::string HexDigest() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    if (EVP_DigestFinal_ex(context_.get(), digest, &size) != 1) Fail();
    static const char kHex[] = "0123456789abcdef";
    std::string hex;
    for (unsigned int i = 0; i < size; ++i) {
      hex += kHex[digest[i] >> 4];
      hex += kHex[digest[i] & 15];
    }
    return hex;
  }

 private:
  [[noreturn]] static void Fail() { throw Error(ExitCode::kInternal, "SHA-256 (OpenSSL libcrypto) failed"); }
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context_;
};

}  // namespace

std::string Sha256Hex(const std::string& data) {
  Sha256 h;
  h.Update(data.data(), data.size());
  return h.HexDigest();
}

std::string Sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw BadInput(path + ": cannot open: " + std::strerror(errno));
  Sha256 h;
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    h.Update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  return h.HexDigest();
}

}  // namespace ckplan
