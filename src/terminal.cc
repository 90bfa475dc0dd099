#include "terminal.h"

#include "ckplan/planner/json_io.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <unistd.h>

namespace ckplan {

std::string FormatTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<bool>& right_align) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      std::string pad(width[c] - cell.size(), ' ');
      bool right = c < right_align.size() && right_align[c];
      line += right ? pad + cell : cell + pad;
      if (c + 1 < rows[r].size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string Format(const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return buffer;
}

void EmitOutput(const std::string& path, const std::string& text, FILE* human) {
  if (path.empty()) return;
  if (path == "-") {
    WriteStdout(text);
    return;
  }
  WriteFileAtomic(path, text);
  std::fprintf(human, "\nwrote %s\n", path.c_str());
}

bool StderrIsTerminal() { return ::isatty(2) == 1; }

}  // namespace ckplan
