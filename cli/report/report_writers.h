#pragma once
// The report's writers: one self-contained HTML page (inline SVG, no
// JavaScript), Markdown, or the `ckplan.report/1` JSON, of a Report value.

#include <string>

#include <nlohmann/json.hpp>

#include "cli/report/report.h"

namespace ckplan {

std::string ReportHtml(const Report& report);
std::string ReportMarkdown(const Report& report);
nlohmann::json ReportJson(const Report& report);

}  // namespace ckplan
