#pragma once
// Running the ckplan binary from tests: exit code, stdout and stderr.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ckplan::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline bool FileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// A fresh temporary directory for one test.
inline std::string TempDir() {
  char pattern[] = "/tmp/ckplan_test_XXXXXX";
  char* dir = ::mkdtemp(pattern);
  return dir ? dir : "/tmp";
}

// Runs `ckplan <args>` through the shell; args are shell words.
inline CommandResult RunCkplan(const std::string& args, const std::string& dir) {
  std::string out_path = dir + "/stdout.txt", err_path = dir + "/stderr.txt";
  std::string command = std::string(CKPLAN_BINARY) + " " + args + " >" + out_path + " 2>" + err_path + " </dev/null";
  int status = std::system(command.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadAll(out_path);
  r.err = ReadAll(err_path);
  return r;
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

}  // namespace ckplan::testing
