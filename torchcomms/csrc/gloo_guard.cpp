// A terminate handler that keeps the process alive when gloo's network thread meets a message
// longer than the buffer posted for it.
//
// Gloo's TCP transport reads on its own thread (its "loop"); when the ranks of a collective
// pass tensors of different sizes, a receive finds more bytes than its buffer holds and gloo throws
// gloo::EnforceNotMet ("Received data size doesn't match expected size") on that thread, where
// nothing catches it: std::terminate, and the process aborts. This handler, for that exception on
// that thread only, records the message and parks the thread for good (no unwinding: the pair's
// lock stays held, so nothing else may use the engine); the Python side sees the record and fails
// the op with a typed error. Every other terminate goes to the handler installed before.
//
// Plain C ABI (loaded with ctypes), no torch headers: it builds in a fraction of a second.
#include <cxxabi.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <typeinfo>

namespace {

constexpr int kSlots = 64;
constexpr int kMessage = 512;
constexpr const char* kEnforce = "N4gloo13EnforceNotMetE";
constexpr const char* kOverflow = "Received data size doesn't match expected size";

struct Parked {
  std::atomic<long> tid{0};  // set last: a reader that sees it sees the message
  char message[kMessage];
};

Parked g_parked[kSlots];
std::atomic<int> g_claimed{0};
std::terminate_handler g_previous = nullptr;

// Only a thread of gloo's own reaches std::terminate with this exception: Python's calls into
// gloo catch theirs (pybind11 turns them into Python errors). The thread is not asked its name:
// torch 2.13's gloo names its network thread "gloo_tcp_loop", and with that name required, a size
// mismatch under torch 2.11 still aborted the process.
bool is_receive_overflow(char* message, size_t size) {
  std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr || std::strcmp(type->name(), kEnforce) != 0) {
    return false;
  }
  try {
    throw;
  } catch (const std::exception& e) {
    std::snprintf(message, size, "%s", e.what());
  } catch (...) {
    return false;
  }
  return std::strstr(message, kOverflow) != nullptr;
}

void on_terminate() {
  char message[kMessage] = {0};
  if (is_receive_overflow(message, sizeof message)) {
    int slot = g_claimed.fetch_add(1);
    if (slot < kSlots) {
      std::memcpy(g_parked[slot].message, message, sizeof message);
      g_parked[slot].tid.store(static_cast<long>(syscall(SYS_gettid)));
    }
    for (;;) {
      pause();
    }
  }
  if (g_previous != nullptr) {
    g_previous();
  }
  std::abort();
}

}  // namespace

extern "C" {

// Install the handler (once per process; later calls do nothing).
void tc_gloo_guard_install() {
  static std::atomic<bool> installed{false};
  if (!installed.exchange(true)) {
    g_previous = std::set_terminate(on_terminate);
  }
}

// How many loop threads are parked (a cheap test before looking one up).
int tc_gloo_guard_parked_count() { return g_claimed.load(); }

// Copy into `out` the message of the parked loop thread `tid`; 1 when it is parked, else 0.
int tc_gloo_guard_message(long tid, char* out, int size) {
  int n = g_claimed.load();
  for (int i = 0; i < n && i < kSlots; ++i) {
    if (g_parked[i].tid.load() == tid) {
      std::snprintf(out, static_cast<size_t>(size), "%s", g_parked[i].message);
      return 1;
    }
  }
  return 0;
}
}
