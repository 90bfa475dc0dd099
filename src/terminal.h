#pragma once
/// Small helpers for what the CLI prints: tables and progress lines.

#include <cstdio>
#include <string>
#include <vector>

namespace ckplan {

/// A plain text table: columns padded to the widest cell; the first row is
/// the header. Numbers right-aligned when `right_align[i]`.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<bool>& right_align);

/// printf into a std::string.
std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// Where a command's JSON goes: `-` is stdout, an empty path nowhere, any
/// other path a file written atomically, announced on `human` as `wrote PATH`.
void EmitOutput(const std::string& path, const std::string& text, FILE* human);

/// True when stderr is a terminal (progress lines are shown only then).
bool StderrIsTerminal();

}  // namespace ckplan
