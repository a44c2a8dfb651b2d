// The per-thread message behind flash3::last_error() and flash3_last_error().
#pragma once

#include "check_result.hpp"

namespace flash3::host {

// Records a failure for last_error() and returns its status.
Status record(const CheckResult& result) noexcept;
// For exception handlers: never throws, even when out of memory (the message
// may then be lost, the status is not).
Status record(Status status, const char* message) noexcept;
void clear_last_error() noexcept;

}  // namespace flash3::host
