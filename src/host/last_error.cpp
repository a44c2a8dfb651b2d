#include "last_error.hpp"

#include <string>

#include "export.hpp"

namespace flash3 {
namespace {
// thread_local: concurrent callers on different threads never see each
// other's messages, and no lock sits on the launch path.
thread_local std::string t_last_error;

Status assign(Status status, const char* message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {  // out of memory: keep the status, lose the message
    t_last_error.clear();
  }
  return status;
}
}  // namespace

namespace host {
Status record(const CheckResult& result) noexcept {
  return assign(result.status, result.message.c_str());
}
Status record(Status status, const char* message) noexcept { return assign(status, message); }
void clear_last_error() noexcept { t_last_error.clear(); }
}  // namespace host

FLASH3_CXX_EXPORT const char* last_error() { return t_last_error.c_str(); }

}  // namespace flash3
