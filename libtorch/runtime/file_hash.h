#pragma once
/// SHA-256 of a file, for a model's identity in profiles and plans (OpenSSL's
/// libcrypto; torch-free).

#include <string>

namespace ckplan {

/// Lower-case hex digest of `data`.
std::string Sha256Hex(const std::string& data);

/// Digest of the file at `path`; throws BadInput naming it if unreadable.
std::string Sha256File(const std::string& path);

}  // namespace ckplan
