#include "signal_worker.h"

#include <pybind11/pybind11.h>

#include <chrono>
#include <exception>
#include <future>
#include <thread>

#include "comm/stop_signals.h"

namespace py = pybind11;

namespace weightcast::python {

namespace {

constexpr auto kSignalPoll = std::chrono::milliseconds(50);

}  // namespace

void SignalWorker::interrupt() {
  interrupted_ = true;
  // The communicator is alive while the data phase runs (groups are replaced only between
  // updates, on the worker), and abort() may be called from any thread.
  if (phase_ == Phase::kData) {
    if (comm::Communicator* comm = comm_.load()) comm->abort();
  }
}

void SignalWorker::run(const std::function<void()>& fn) {
  std::promise<void> done;
  auto finished = done.get_future();
  interrupted_ = false;
  std::exception_ptr pending;
  {
    py::gil_scoped_release release;
    std::thread worker([&fn, &done] {
      // Signals stay with the interpreter's thread, so the worker and every thread it starts (the
      // data plane's, the HTTP calls') never see an EINTR from a Ctrl-C meant for Python.
      comm::block_stop_signals();
      fn();
      done.set_value();
    });
    while (finished.wait_for(kSignalPoll) != std::future_status::ready) {
      py::gil_scoped_acquire gil;
      if (!pending && PyErr_CheckSignals() != 0) {
        try {
          throw py::error_already_set();
        } catch (...) {
          pending = std::current_exception();
        }
        interrupt();
      }
    }
    worker.join();
  }
  if (pending) std::rethrow_exception(pending);
}

}  // namespace weightcast::python
