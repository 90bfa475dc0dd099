#pragma once
// How much memory a profile or run may allocate before it is refused (a
// one-line error, exit 2) instead of being killed by the system. Torch-free.
// Part of the runtime.

#include <cstdint>
#include <string>

namespace ckplan {

struct MemoryLimit {
  int64_t bytes = 0;   ///< 0: no limit known
  std::string source;  ///< what it is, for the error message
};

/// CKPLAN_MEMORY_LIMIT (a byte quantity: `2GiB`, `64MB`; tests lower it) if
/// set, else this machine's available memory (MemAvailable in /proc/meminfo)
/// less a margin of a tenth, at least 256 MiB. A bad CKPLAN_MEMORY_LIMIT is
/// BadInput.
MemoryLimit StepMemoryLimit();

}  // namespace ckplan
