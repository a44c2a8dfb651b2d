// flash3.hpp is a fixed public header without visibility attributes, and the
// library is compiled with -fvisibility=hidden; definitions of the C++ API
// carry this so they stay exported (exports.map then lists them).
#pragma once

#define FLASH3_CXX_EXPORT __attribute__((visibility("default")))
