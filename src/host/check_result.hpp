// Outcome of a host-side check, and the message helper all checks share.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "flash3/flash3.hpp"

namespace flash3::host {

// kOk with an empty message (no allocation on the success path), or a status
// with a message that names the argument, what was expected and what was given.
struct CheckResult {
  Status status = Status::kOk;
  std::string message;

  bool ok() const { return status == Status::kOk; }
  static CheckResult fail(Status status, std::string message) {
    return CheckResult{status, std::move(message)};
  }
};

// Concatenates with operator<< (failure paths only, so iostream cost is fine).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace flash3::host
