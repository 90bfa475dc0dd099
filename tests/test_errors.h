#pragma once
// What a contract's reader says when it refuses a document: for the tests
// of every reader's refusals (plan, sweep, run, report).

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/base/error.h"

namespace ckplan::testing {

/// The message `read` throws (as ckplan::Error) for `good` changed by
/// `mutate`, or "(no error)" when it reads it.
inline std::string Refusal(const nlohmann::json& good, const std::function<void(nlohmann::json&)>& mutate,
                           const std::function<void(const nlohmann::json&)>& read) {
  nlohmann::json doc = good;
  mutate(doc);
  try {
    read(doc);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace ckplan::testing
