// error_of(f): the message of the retroinfer::Error that f throws, or "<no error>" (for assertions on what
// an error says).
#pragma once

#include <string>

#include "retroinfer/error.h"

namespace retroinfer::test {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace retroinfer::test
