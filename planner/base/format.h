#pragma once
/// printf into a std::string: the planner's messages and the CLI's lines.

#include <string>

namespace ckplan {

/// printf into a std::string (at most 1023 characters: longer is cut).
std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ckplan
