#include "planner/base/json_io.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "planner/base/error.h"
#include "planner/base/units.h"

namespace ckplan {

namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

// Closes a descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

constexpr int kFifoWaitMs = 5000;

std::string ReadInputText(const std::string& path) {
  // O_NONBLOCK: opening a FIFO nobody writes to must not block.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == EISDIR) throw BadInput(path + ": is a directory, not a JSON file");
    throw BadInput(path + ": cannot open: " + ErrnoText(errno));
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw BadInput(path + ": cannot open: " + ErrnoText(errno));
  if (S_ISDIR(info.st_mode)) throw BadInput(path + ": is a directory, not a JSON file");
  if (S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode)) {
    throw BadInput(path + ": is a device, not a JSON file");
  }
  const std::string limit = LimitText(kMaxInputFileBytes);
  if (S_ISREG(info.st_mode) && info.st_size > kMaxInputFileBytes) {
    throw BadInput(path + ": too large (" + FormatBytes(info.st_size) + "; ckplan reads JSON files up to " + limit + ")");
  }
  const bool stream = !S_ISREG(info.st_mode);
  std::string text;
  if (!stream) text.reserve(static_cast<size_t>(info.st_size));
  std::vector<char> buffer(1 << 16);
  bool waited = false;
  while (true) {
    ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n > 0) {
      if (static_cast<int64_t>(text.size()) + n > kMaxInputFileBytes) {
        throw BadInput(path + ": too large (more than " + limit + ", the most ckplan reads)");
      }
      text.append(buffer.data(), static_cast<size_t>(n));
      continue;
    }
    // A FIFO that no writer has opened yet reads as at its end: wait for one.
    const bool wait_for_writer = n == 0 && stream && text.empty() && !waited;
    if (n == 0 && !wait_for_writer) break;
    if (n < 0 && errno == EINTR) continue;
    if (wait_for_writer || errno == EAGAIN || errno == EWOULDBLOCK) {
      waited = waited || wait_for_writer;
      struct pollfd p {fd.get(), POLLIN, 0};
      int ready = ::poll(&p, 1, kFifoWaitMs);
      if (ready == 0) {
        throw BadInput(path + ": nothing to read after " + std::to_string(kFifoWaitMs / 1000) +
                       " s (a FIFO nobody writes to?)");
      }
      if (ready < 0 && errno != EINTR) throw BadInput(path + ": cannot read: " + ErrnoText(errno));
      continue;
    }
    throw BadInput(path + ": cannot read: " + ErrnoText(errno));
  }
  if (stream && text.empty()) throw BadInput(path + ": empty (a FIFO nobody writes to?)");
  return text;
}

// Where the parser is, for errors: the path of the value being read, and the
// nesting depth (refused past kMaxJsonDepth, so that nothing that walks the
// document later recurses deeply).
class ParsePosition {
 public:
  explicit ParsePosition(std::string file) : file_(std::move(file)) {}

  bool Event(nlohmann::json::parse_event_t event, const nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (static_cast<int>(frames_.size()) >= kMaxJsonDepth) {
          throw BadInput(file_ + ": field '" + Path() + "': nested deeper than " + std::to_string(kMaxJsonDepth) +
                         " levels");
        }
        frames_.push_back({event == Event::array_start, std::string(), 0});
        break;
      case Event::key:
        if (!frames_.empty()) frames_.back().key = parsed.is_string() ? parsed.get<std::string>() : std::string();
        break;
      case Event::object_end:
      case Event::array_end:
        if (!frames_.empty()) frames_.pop_back();
        Advance();
        break;
      case Event::value:
        Advance();
        break;
    }
    return true;
  }

  // `stages[3].saved_bytes`; `<root>` at the top. Deep paths show their
  // first levels and `...`.
  std::string Path() const {
    constexpr size_t kShownLevels = 8;
    std::string path;
    for (size_t level = 0; level < frames_.size(); ++level) {
      if (level == kShownLevels) {
        path += "...";
        break;
      }
      const Frame& f = frames_[level];
      if (f.array) {
        path += "[" + std::to_string(f.index) + "]";
      } else if (!f.key.empty()) {
        if (!path.empty()) path += ".";
        path += f.key;
      }
    }
    return path.empty() ? "<root>" : path;
  }

 private:
  struct Frame {
    bool array;
    std::string key;
    size_t index;
  };
  void Advance() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }
  std::string file_;
  std::vector<Frame> frames_;
};

// The temporary output being written, for the signal handler.
char g_temporary_path[4096];
volatile sig_atomic_t g_temporary_active = 0;

extern "C" void RemoveTemporaryAndDie(int signal_number) {
  if (g_temporary_active) ::unlink(g_temporary_path);
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

// Installs the handler while a temporary file exists; restores the old ones.
class TemporaryFileGuard {
 public:
  explicit TemporaryFileGuard(const std::string& path) {
    if (path.size() >= sizeof(g_temporary_path)) return;
    std::memcpy(g_temporary_path, path.c_str(), path.size() + 1);
    struct sigaction action {};
    action.sa_handler = RemoveTemporaryAndDie;
    sigemptyset(&action.sa_mask);
    for (size_t k = 0; k < kSignals.size(); ++k) ::sigaction(kSignals[k], &action, &old_[k]);
    g_temporary_active = 1;
    installed_ = true;
  }
  ~TemporaryFileGuard() {
    if (!installed_) return;
    g_temporary_active = 0;
    for (size_t k = 0; k < kSignals.size(); ++k) ::sigaction(kSignals[k], &old_[k], nullptr);
  }
  TemporaryFileGuard(const TemporaryFileGuard&) = delete;
  TemporaryFileGuard& operator=(const TemporaryFileGuard&) = delete;

 private:
  static constexpr std::array<int, 4> kSignals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  std::array<struct sigaction, 4> old_{};
  bool installed_ = false;
};

// Writes all of `text` to `fd`; returns 0 or the errno of the failure.
int WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

std::string ParentFolder(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string LimitText(int64_t bytes) {
  for (auto [shift, name] : {std::pair<int, const char*>{60, "EiB"}, {50, "PiB"}, {40, "TiB"}, {30, "GiB"}, {20, "MiB"}}) {
    if (bytes >= (int64_t{1} << shift) && bytes % (int64_t{1} << shift) == 0) {
      return std::to_string(bytes >> shift) + " " + name;
    }
  }
  return std::to_string(bytes) + " B";
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  return sum;
}

nlohmann::json ParseJsonText(const std::string& text, const std::string& file) {
  ParsePosition position(file);
  try {
    return nlohmann::json::parse(
        text, [&position](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          return position.Event(event, parsed);
        });
  } catch (const nlohmann::json::parse_error& e) {
    throw BadInput(file + ": malformed JSON at byte " + std::to_string(e.byte) + " (in '" + position.Path() + "')");
  } catch (const nlohmann::json::out_of_range&) {
    throw BadInput(file + ": field '" + position.Path() + "': number out of the range of a double");
  } catch (const nlohmann::json::exception& e) {
    throw BadInput(file + ": malformed JSON (in '" + position.Path() + "'): " + e.what());
  }
}

nlohmann::json ReadJsonFile(const std::string& path) { return ParseJsonText(ReadInputText(path), path); }

void CheckOutputPath(const std::string& path) {
  if (path.empty() || path == "-") return;
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    throw BadInput(path + ": cannot write: is a directory");
  }
  const std::string folder = ParentFolder(path);
  if (::stat(folder.c_str(), &info) != 0) {
    throw BadInput(path + ": cannot write: folder " + folder + " does not exist");
  }
  if (!S_ISDIR(info.st_mode)) throw BadInput(path + ": cannot write: " + folder + " is not a folder");
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw BadInput(path + ": cannot write: folder " + folder + ": " + ErrnoText(errno));
  }
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  CheckOutputPath(path);
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    // A device or a FIFO: written to, never replaced by a regular file.
    FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENXIO) throw BadInput(path + ": cannot write: a FIFO nobody reads");
      throw BadInput(path + ": cannot write: " + ErrnoText(errno));
    }
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    if (int error = WriteAll(fd.get(), text)) {
      throw Error(ExitCode::kInternal, path + ": write failed: " + ErrnoText(error));
    }
    return;
  }
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  TemporaryFileGuard guard(temporary);
  FileDescriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw BadInput(path + ": cannot write: " + ErrnoText(errno));
  int error = WriteAll(fd.get(), text);
  if (::close(fd.release()) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(temporary.c_str());
    throw Error(ExitCode::kInternal, path + ": write failed: " + ErrnoText(error));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    int saved_errno = errno;
    ::unlink(temporary.c_str());
    throw BadInput(path + ": cannot write: " + ErrnoText(saved_errno));
  }
}

void WriteStdout(const std::string& text) {
  std::fflush(stdout);
  if (int error = WriteAll(1, text)) throw Error(ExitCode::kInternal, "cannot write to stdout: " + ErrnoText(error));
}

JsonReader::JsonReader(const nlohmann::json& node, std::string file, std::string path)
    : node_(node), file_(std::move(file)), path_(std::move(path)) {}

void JsonReader::Fail(const std::string& why) const {
  throw BadInput(file_ + ": field '" + (path_.empty() ? "<root>" : path_) + "': " + why);
}

void JsonReader::ExpectObject() const {
  if (!node_.is_object()) Fail("expected an object");
}

void JsonReader::ExpectSchema(const std::string& kind) const {
  const JsonReader field = Field("schema");
  const std::string schema = field.String();
  const std::string expected = "ckplan." + kind + "/1";
  if (schema == expected) return;
  const std::string prefix = "ckplan." + kind + "/";
  if (schema.rfind(prefix, 0) == 0) {
    const std::string version = schema.substr(prefix.size());
    if (!version.empty() && version.size() < 9 &&
        std::all_of(version.begin(), version.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        std::stoi(version) > 1) {
      field.Fail("made by a newer ckplan (" + kind + "/" + version + "); this one reads " + kind +
                 "/1: use the ckplan that made it, or make it again with this one");
    }
  }
  field.Fail("expected \"" + expected + "\", got \"" + schema + "\"");
}

bool JsonReader::Has(const std::string& key) const {
  return node_.is_object() && node_.contains(key);
}

JsonReader JsonReader::Field(const std::string& key) const {
  ExpectObject();
  std::string child = path_.empty() ? key : path_ + "." + key;
  auto it = node_.find(key);
  if (it == node_.end()) {
    throw BadInput(file_ + ": field '" + child + "': missing");
  }
  return JsonReader(*it, file_, child);
}

size_t JsonReader::ArraySize() const {
  if (!node_.is_array()) Fail("expected an array");
  return node_.size();
}

JsonReader JsonReader::Item(size_t index) const {
  if (!node_.is_array() || index >= node_.size()) Fail("expected an array element");
  return JsonReader(node_[index], file_, path_ + "[" + std::to_string(index) + "]");
}

std::string JsonReader::String() const {
  if (!node_.is_string()) Fail("expected a string");
  return node_.get<std::string>();
}

double JsonReader::NonNegativeNumber(double max) const {
  if (!node_.is_number()) Fail("expected a number");
  double value = node_.get<double>();
  if (!std::isfinite(value)) Fail("expected a finite number");
  if (value < 0) Fail("must not be negative, got " + node_.dump());
  if (value > max) Fail("too large: " + node_.dump() + " is above " + nlohmann::json(max).dump() + ", more than any model takes");
  return value;
}

double JsonReader::FiniteNumber() const {
  if (!node_.is_number()) Fail("expected a number");
  const double value = node_.get<double>();
  if (!std::isfinite(value)) Fail("expected a finite number");
  return value;
}

int64_t JsonReader::NonNegativeBytes() const {
  if (!node_.is_number()) Fail("expected a byte count");
  const std::string too_large = "too large: " + node_.dump() + " B is above " + LimitText(kMaxFieldBytes) +
                                ", more than any model has";
  if (node_.is_number_unsigned()) {
    uint64_t v = node_.get<uint64_t>();
    if (v > static_cast<uint64_t>(kMaxFieldBytes)) Fail(too_large);
    return static_cast<int64_t>(v);
  }
  if (node_.is_number_integer()) {
    int64_t v = node_.get<int64_t>();
    if (v < 0) Fail("must not be negative, got " + node_.dump());
    if (v > kMaxFieldBytes) Fail(too_large);
    return v;
  }
  double v = node_.get<double>();
  if (!std::isfinite(v)) Fail("expected a finite byte count");
  if (v < 0) Fail("must not be negative, got " + node_.dump());
  if (v > static_cast<double>(kMaxFieldBytes)) Fail(too_large);
  if (v != std::floor(v)) Fail("expected a whole number of bytes, got " + node_.dump());
  return static_cast<int64_t>(v);
}

int64_t JsonReader::Integer() const {
  if (!node_.is_number_integer()) Fail("expected an integer");
  if (node_.is_number_unsigned() && node_.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) Fail("out of range");
  return node_.get<int64_t>();
}

int JsonReader::IntegerIn(int64_t lo, int64_t hi) const {
  lo = std::max<int64_t>(lo, std::numeric_limits<int>::min());
  hi = std::min<int64_t>(hi, std::numeric_limits<int>::max());
  int64_t v = Integer();
  if (v < lo || v > hi) Fail("out of range " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + std::to_string(v));
  return static_cast<int>(v);
}

bool JsonReader::Bool() const {
  if (!node_.is_boolean()) Fail("expected true or false");
  return node_.get<bool>();
}

}  // namespace ckplan
