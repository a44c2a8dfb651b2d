// The per-thread message behind flash3::last_error() and flash3_last_error().
#pragma once

#include <exception>
#include <new>

#include "check_result.hpp"

namespace flash3::host {

// Records a failure for last_error() and returns its status.
Status record(const CheckResult& result) noexcept;
// For exception handlers: never throws, even when out of memory (the message
// may then be lost, the status is not).
Status record(Status status, const char* message) noexcept;
void clear_last_error() noexcept;

// The C++ API never throws: runs `checked` (which returns a Status) and turns
// anything escaping it into a recorded kInternal status.
template <class Checked>
Status never_throws(Checked&& checked) noexcept {
  try {
    return checked();
  } catch (const std::bad_alloc&) {
    return record(Status::kInternal, "flash3: out of host memory");
  } catch (const std::exception& e) {
    return record(Status::kInternal, e.what());
  } catch (...) {
    return record(Status::kInternal, "flash3 internal error: unknown exception");
  }
}

}  // namespace flash3::host
