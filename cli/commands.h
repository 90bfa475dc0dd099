#pragma once
/// The subcommands of `ckplan`. Each Add*Command registers its options on
/// `app` and, when chosen, stores what to run in `*action` (which returns the
/// exit code). main() parses, runs the action and maps errors to exit codes.

#include <functional>

namespace CLI {
class App;
}

namespace ckplan {

using Action = std::function<int()>;

void AddSolveCommand(CLI::App& app, Action* action);
void AddReportCommand(CLI::App& app, Action* action);
#ifdef CKPLAN_WITH_TORCH
void AddProfileCommand(CLI::App& app, Action* action);
void AddRunCommand(CLI::App& app, Action* action);
#endif

}  // namespace ckplan
