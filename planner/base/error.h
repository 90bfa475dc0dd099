#pragma once
/// The one error type of ckplan, and the process exit codes it maps to.

#include <stdexcept>
#include <string>

namespace ckplan {

/// Exit codes, one per kind of failure (documented in the README and docs/commands.md).
enum class ExitCode : int {
  kOk = 0,
  kInternal = 1,       ///< a bug or an unexpected failure
  kBadInput = 2,       ///< malformed file, wrong schema, bad option value
  kInfeasible = 3,     ///< the budget is below the smallest feasible one
  kVerifyFailed = 4,   ///< a plan failed its check (simulation or real run)
};

/// Thrown by library code; caught once in main and printed as
/// `ckplan: error: <message>`. Messages are lower-case, no trailing period,
/// and name the file, field or value at fault.
class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

/// Shorthand for the common case: bad input (exit code 2).
inline Error BadInput(const std::string& message) {
  return Error(ExitCode::kBadInput, message);
}

}  // namespace ckplan
