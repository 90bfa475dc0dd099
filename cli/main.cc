// ckplan: measure what a model keeps for backward, and plan where to
// checkpoint it so that a training step fits a memory budget.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include <CLI/CLI.hpp>

#include "planner/base/error.h"
#include "cli/commands.h"

#if defined(CKPLAN_TORCH_HELPER) && !defined(CKPLAN_WITH_TORCH)
#include <unistd.h>

#include <climits>

namespace {

// `ckplan` itself never loads LibTorch (it starts in milliseconds): profile
// and run are done by CKPLAN_TORCH_HELPER, the same CLI with the LibTorch
// parts, installed next to it. The process is replaced: its exit code,
// output and signals are the helper's.
int ExecTorchHelper(char** argv) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = '\0';
    dir = self;
    dir = dir.substr(0, dir.rfind('/'));
  }
  const std::string helper = dir + "/" + CKPLAN_TORCH_HELPER;
  ::execv(helper.c_str(), argv);
  std::fprintf(stderr, "ckplan: error: '%s' runs in %s, which cannot be started: %s\n", argv[1], helper.c_str(),
               std::strerror(errno));
  return static_cast<int>(ckplan::ExitCode::kInternal);
}

}  // namespace
#endif

int main(int argc, char** argv) {
#if defined(CKPLAN_TORCH_HELPER) && !defined(CKPLAN_WITH_TORCH)
  if (argc > 1 && (std::strcmp(argv[1], "profile") == 0 || std::strcmp(argv[1], "run") == 0)) {
    return ExecTorchHelper(argv);
  }
#endif
  CLI::App app{
      "ckplan: gradient checkpointing planner.\n"
      "  profile  measure per-op activation sizes and times of a model (.pt2 from torch.export, or TorchScript)\n"
      "  solve    find the checkpoint schedule with the least recomputation under a budget\n"
      "  run      run a real training step under a plan and check it\n"
      "  report   compare strategies over budgets: HTML with figures, Markdown or JSON\n"
      "Exit codes: 0 ok, 1 internal error, 2 bad input, 3 budget below the minimum, 4 check failed."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ckplan 0.1.0");
  ckplan::Action action;
#ifdef CKPLAN_WITH_TORCH
  ckplan::AddProfileCommand(app, &action);
#elif defined(CKPLAN_TORCH_HELPER)
  // Listed for --help; `ckplan profile ...` never gets here (see above).
  app.add_subcommand("profile", "measure a model (LibTorch: runs " CKPLAN_TORCH_HELPER "); see ckplan profile --help");
#endif
  ckplan::AddSolveCommand(app, &action);
#ifdef CKPLAN_WITH_TORCH
  ckplan::AddRunCommand(app, &action);
#elif defined(CKPLAN_TORCH_HELPER)
  app.add_subcommand("run", "a real training step under a plan (LibTorch: runs " CKPLAN_TORCH_HELPER
                            "); see ckplan run --help");
#endif
  ckplan::AddReportCommand(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line in ckplan's own form, not CLI11's two.
    std::string message = e.what();
    for (char& c : message) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "ckplan: error: %s (see ckplan --help)\n", message.c_str());
    return static_cast<int>(ckplan::ExitCode::kBadInput);
  }
  int code = 0;
  try {
    code = action ? action() : 0;
  } catch (const ckplan::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "ckplan: error: %s\n", e.what());
    return static_cast<int>(e.code());
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "ckplan: error: out of memory\n");
    return static_cast<int>(ckplan::ExitCode::kInternal);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // One line: LibTorch's messages carry a backtrace on the lines after.
    std::string what = e.what();
    const size_t start = std::min(what.find_first_not_of('\n'), what.size());
    what = what.substr(start, what.find('\n', start) - start);
    std::fprintf(stderr, "ckplan: error: internal: %s\n", what.c_str());
    return static_cast<int>(ckplan::ExitCode::kInternal);
  }
  // What went to stdout must have arrived (a full disk, a closed pipe).
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "ckplan: error: cannot write to stdout: %s\n", std::strerror(errno));
    return static_cast<int>(ckplan::ExitCode::kInternal);
  }
  return code;
}
