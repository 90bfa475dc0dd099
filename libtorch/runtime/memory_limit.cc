#include "libtorch/runtime/memory_limit.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "planner/base/error.h"
#include "planner/base/units.h"

namespace ckplan {

MemoryLimit StepMemoryLimit() {
  if (const char* text = std::getenv("CKPLAN_MEMORY_LIMIT"); text != nullptr && *text != '\0') {
    return {ParseBytes(text, "CKPLAN_MEMORY_LIMIT").bytes, std::string("CKPLAN_MEMORY_LIMIT=") + text};
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:" && kib > 0) {
      const int64_t available = kib * 1024;
      const int64_t margin = std::max<int64_t>(available / 10, int64_t{256} << 20);
      const int64_t limit = std::max<int64_t>(available - margin, available / 2);
      return {limit, "this machine's available memory (" + FormatBytes(available) + ", less a margin)"};
    }
  }
  return {};
}

}  // namespace ckplan
