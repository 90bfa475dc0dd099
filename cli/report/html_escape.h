#pragma once
// Text inside HTML and SVG: the report's figures and tables.

#include <string>

namespace ckplan {

/// `s` with <, >, & and " as entities.
std::string Escape(const std::string& s);

}  // namespace ckplan
