// A c10d Backend whose every operation is forwarded to a torchcomms communicator.
//
// torch.distributed registers one Backend per device of a ProcessGroup; Python cannot construct
// one, so this class is the smallest C++ shim that can. It owns no engine and makes no decision:
// each op becomes one call of torchcomms._comms.forward.CommForwarder (Python), which issues it
// through the communicator's one dispatch path (validation, flight recorder, deadline, typed
// errors, recovery). The returned Work wraps that op's Python work object; its wait() calls the
// Python wait(), so a CommTimeoutError / PeerFailureError reaches the caller unchanged.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

// The PREMUL_SUM supplement's type name differs between torch versions; the build passes it.
#ifndef TC_PREMUL_SUPPLEMENT
#define TC_PREMUL_SUPPLEMENT PreMulSumSupplement
#endif

namespace py = pybind11;

namespace torchcomms_ext {

bool pythonAlive() {
  return Py_IsInitialized() && !_Py_IsFinalizing();
}

// Drops a Python reference with the GIL held; leaks it when the interpreter is gone.
void dropPy(py::object& obj) {
  if (!obj) {
    return;
  }
  if (pythonAlive()) {
    py::gil_scoped_acquire gil;
    obj = py::object();
  } else {
    obj.release();
  }
}

// obj.method(args...) with the GIL held. Once torch._dynamo is imported, through
// torchcomms._comms.eager's disabled call: c10d may call the backend inside a torch.compile'd
// function's eager part, where dynamo would compile every Python frame entered (see eager.py).
template <typename... Args>
py::object pyCall(const py::object& obj, const char* method, Args&&... args) {
  if (PyDict_GetItemString(PyImport_GetModuleDict(), "torch._dynamo") == nullptr) {
    return obj.attr(method)(std::forward<Args>(args)...);
  }
  // one reference kept for the process's life (never dropped during finalization)
  static PyObject* eager =
      py::module_::import("torchcomms._comms.eager").attr("disabled_call")().release().ptr();
  return py::reinterpret_borrow<py::object>(eager)(obj, method, std::forward<Args>(args)...);
}

// A Python exception object in a C++ exception, rethrown into Python as that same object, as
// often as it is rethrown: a c10 future rethrows its error on every wait() and value(), and a
// py::error_already_set can be restored only once (the second wait() on a failed op's future
// ended the process: "restore() called a second time", std::terminate). It is torch's own
// python_error, which torch's bindings restore typed wherever they catch it: DDP's reducer
// rethrows a failed all-reduce's future error inside the autograd engine, and backward() raised
// it as a RuntimeError naming the type ("PeerFailureError: ..."), where any other std::exception
// lands. The module's translator restores it for pybind11's bindings. Its references are
// dropped with the GIL, or leaked once Python is gone (never acquired during finalization).
class PyErrorValue : public python_error {
 public:
  explicit PyErrorValue(const py::object& exc) {
    value = exc.inc_ref().ptr();
    type = reinterpret_cast<PyObject*>(Py_TYPE(value));
    Py_INCREF(type);
    traceback = PyException_GetTraceback(value);
    message = py::str(py::type::handle_of(exc).attr("__name__")).cast<std::string>() + ": " +
        py::str(exc).cast<std::string>();
  }

  PyErrorValue(const PyErrorValue& other) = default;

  ~PyErrorValue() override {
    if (!pythonAlive()) {  // leak: python_error's destructor would take the GIL
      type = value = traceback = nullptr;
    }
  }
};

// A Python exception (GIL held) as an exception_ptr that raises it wherever it reaches Python.
std::exception_ptr asExceptionPtr(const py::object& exc) {
  return std::make_exception_ptr(PyErrorValue(exc));
}

// A Python exception (GIL held) as a py::error_already_set: restored into Python once, as the
// very object (torch's Work.exception() binding hands it back typed). Only for an exception_ptr
// made anew for each caller, never one stored and rethrown again (see PyErrorValue).
std::exception_ptr asRestoredOnce(const py::object& exc) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  return std::make_exception_ptr(py::error_already_set());
}

void translatePyErrorValue(std::exception_ptr p) {
  try {
    if (p) {
      std::rethrow_exception(p);
    }
  } catch (PyErrorValue& e) {
    e.restore();
  }
}

// A reduce op as plain values (no Python objects, so it can be built without the GIL):
// (c10d op kind, PREMUL_SUM scalar factor, PREMUL_SUM tensor factor).
using RedArg = std::tuple<int, std::optional<double>, std::optional<at::Tensor>>;

RedArg reduceOpArgs(const c10d::ReduceOp& op) {
  RedArg out{static_cast<int>(op.op_), std::nullopt, std::nullopt};
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM && op.supplement_) {
    auto* sup = dynamic_cast<c10d::TC_PREMUL_SUPPLEMENT*>(op.supplement_.get());
    if (sup != nullptr) {
      if (sup->tensor_factor.defined()) {
        std::get<2>(out) = sup->tensor_factor;
      } else {
        std::get<1>(out) = sup->double_factor;
      }
    }
  }
  return out;
}

// An op's timeout in ms, or nothing when c10d left it unset.
std::optional<int64_t> timeoutArg(std::chrono::milliseconds timeout) {
  return timeout.count() < 0 ? std::nullopt : std::optional<int64_t>(timeout.count());
}

class ForwardedWork : public c10d::Work {
 public:
  ForwardedWork(py::object work, py::object forwarder, std::vector<at::Tensor> outputs, c10d::OpType type, int rank)
      : c10d::Work(rank, type), work_(std::move(work)), fw_(std::move(forwarder)), outputs_(std::move(outputs)) {}

  ~ForwardedWork() override {
    dropPy(work_);
    dropPy(fw_);
  }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return pyCall(work_, "is_completed").cast<bool>();
  }

  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return pyCall(work_, "is_success").cast<bool>();
  }

  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object exc = pyCall(work_, "exception");
    return exc.is_none() ? nullptr : asRestoredOnce(exc);
  }

  // Blocks until the op ends; never past the op's deadline. Raises the op's typed error.
  bool wait(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    if (timeout.count() <= 0) {  // c10d's kNoTimeout: wait for the op itself
      pyCall(work_, "wait");
      return true;
    }
    double secs = static_cast<double>(timeout.count()) / 1000.0;
    if (!pyCall(work_, "wait", secs).cast<bool>()) {
      throw std::runtime_error("torchcomms: Work.wait(timeout) ended before the operation did");
    }
    return true;
  }

  void synchronize() override {}

  // The sender of a completed receive (c10d's recv without a source asks for it after wait()).
  int sourceRank() const override {
    py::gil_scoped_acquire gil;
    return pyCall(work_, "source_rank").cast<int>();
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  void abort() override {
    py::gil_scoped_acquire gil;
    pyCall(fw_, "abort");
  }

  // Completed (with the outputs, or the op's error) by the forwarder's completion threads (_comms/completion.py).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(futureMutex_);
    if (future_) {
      return future_;
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    auto fut = future_;
    auto outs = outputs_;
    py::gil_scoped_acquire gil;
    py::cpp_function done([fut, outs](py::object exc) {
      if (exc.is_none()) {
        py::gil_scoped_release release;
        fut->markCompleted(c10::IValue(outs));
      } else {
        auto eptr = asExceptionPtr(exc);
        py::gil_scoped_release release;
        fut->setError(eptr);
      }
    });
    pyCall(fw_, "on_done", work_, done);
    return future_;
  }

 private:
  py::object work_;
  py::object fw_;
  std::vector<at::Tensor> outputs_;
  std::mutex futureMutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

int commInt(const py::object& comm, const char* method) {
  py::gil_scoped_acquire gil;
  return pyCall(comm, method).cast<int>();
}

class BackendWrapper : public c10d::Backend {
 public:
  explicit BackendWrapper(py::object comm)
      : c10d::Backend(commInt(comm, "get_rank"), commInt(comm, "get_size")), comm_(std::move(comm)) {
    py::gil_scoped_acquire gil;
    fw_ = pyCall(py::module_::import("torchcomms._comms.forward"), "CommForwarder", comm_);
    name_ = pyCall(fw_, "backend_name").cast<std::string>();
  }

  ~BackendWrapper() override {
    dropPy(fw_);
    dropPy(comm_);
  }

  py::object getComm() const {
    return comm_;
  }

  // c10d's `backend.options` (torchcomms._comms.options); called with the GIL held
  py::object options() const {
    return pyCall(fw_, "options");
  }

  const std::string getBackendName() const override {
    return name_;
  }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    py::gil_scoped_acquire gil;
    auto ms = pyCall(fw_, "timeout_ms").cast<int64_t>();
    return c10::make_intrusive<Options>(name_, std::chrono::milliseconds(ms));
  }

  bool supportsSplitting() const override {
    return true;
  }

  bool supportsCoalescing() const override {
    return true;
  }

  void setTimeout(std::chrono::milliseconds timeout) override {
    call("set_timeout", timeout.count());
  }

  void startCoalescing() override {
    call("start_coalescing");
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    return issue(c10d::OpType::COALESCED, {}, "end_coalescing");
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& o) override {
    return issue(c10d::OpType::BROADCAST, tensors, "broadcast", tensors, o.rootRank, o.rootTensor, to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& o) override {
    return issue(c10d::OpType::ALLREDUCE, tensors, "allreduce", tensors, red(o.reduceOp), to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& o) override {
    return issue(c10d::OpType::ALLREDUCE_COALESCED, tensors, "allreduce", tensors, red(o.reduceOp), to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& o) override {
    return issue(c10d::OpType::REDUCE, tensors, "reduce", tensors, o.rootRank, red(o.reduceOp), to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& o) override {
    return issue(c10d::OpType::ALLGATHER, flat(outputs), "allgather", outputs, inputs, to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& o) override {
    return issue(c10d::OpType::ALLGATHER_COALESCED, flat(outputs), "allgather", outputs, inputs, to(o.timeout));
  }

  // The work's result (its future's value) is what c10d's engine of this backend gives: gloo's
  // _allgather_base is its allgather into output.chunk(size), so the output's chunks, one per
  // rank (views of it); nccl's (and the others') [output].
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& o) override {
    std::vector<at::Tensor> result = name_ == "gloo" ? output.chunk(getSize(), 0) : std::vector<at::Tensor>{output};
    return issue(c10d::OpType::_ALLGATHER_BASE, std::move(result), "allgather_into_tensor",
                 std::vector<at::Tensor>{output}, std::vector<at::Tensor>{input}, to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& o) override {
    return issue(c10d::OpType::COALESCED, outputs, "allgather_into_tensor", outputs, inputs, to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& o) override {
    return issue(c10d::OpType::GATHER, flat(outputs), "gather", outputs, inputs, o.rootRank, to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& o) override {
    return issue(c10d::OpType::SCATTER, outputs, "scatter", outputs, inputs, o.rootRank, to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& o) override {
    return issue(c10d::OpType::REDUCE_SCATTER, outputs, "reduce_scatter", outputs, inputs, red(o.reduceOp),
                 to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& o) override {
    return issue(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, "reduce_scatter_tensor",
                 std::vector<at::Tensor>{output}, std::vector<at::Tensor>{input}, red(o.reduceOp), to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& o) override {
    return issue(c10d::OpType::COALESCED, outputs, "reduce_scatter_tensor", outputs, inputs, red(o.reduceOp),
                 to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
      const c10d::AllToAllOptions& o) override {
    return issue(c10d::OpType::ALLTOALL_BASE, {output}, "alltoall_base", output, input, outputSplits, inputSplits,
                 to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions& o) override {
    return issue(c10d::OpType::ALLTOALL, outputs, "alltoall", outputs, inputs, to(o.timeout));
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return issue(c10d::OpType::SEND, tensors, "send", tensors, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return issue(c10d::OpType::RECV, tensors, "recv", tensors, src, tag);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return issue(c10d::OpType::RECVANYSOURCE, tensors, "recv_anysource", tensors, tag);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    return issue(c10d::OpType::BARRIER, {}, "barrier", to(o.timeout));
  }

  // c10d's monitored_barrier (gloo's contract: raises naming the ranks that did not arrive).
  void monitoredBarrier(const c10d::BarrierOptions& o, bool waitAllRanks) override {
    call("monitored_barrier", to(o.timeout), waitAllRanks);
  }

  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& /*store*/, const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) override {
    py::gil_scoped_acquire gil;
    py::object child = pyCall(fw_, "split", ranks, opts ? opts->group_name : std::string(),
                               opts ? timeoutArg(opts->timeout) : std::nullopt);
    if (child.is_none()) {
      return nullptr;
    }
    return c10::make_intrusive<BackendWrapper>(child);
  }

  void setSequenceNumberForGroup() override {}

  uint64_t getSequenceNumberForGroup() override {
    py::gil_scoped_acquire gil;
    return pyCall(fw_, "sequence_number").cast<uint64_t>();
  }

  void abort() override {
    if (pythonAlive()) {
      call("abort");
    }
  }

  void shutdown() override {
    if (pythonAlive()) {
      call("shutdown");
    }
  }

 private:
  static std::optional<int64_t> to(std::chrono::milliseconds timeout) {
    return timeoutArg(timeout);
  }

  static RedArg red(const c10d::ReduceOp& op) {
    return reduceOpArgs(op);
  }

  static std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<at::Tensor> out;
    for (const auto& l : lists) {
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  }

  // Calls a forwarder method for its effect; its result is dropped here, under the GIL.
  template <typename... Args>
  void call(const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    pyCall(fw_, method, std::forward<Args>(args)...);
  }

  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> issue(
      c10d::OpType type, std::vector<at::Tensor> outputs, const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    py::object work = pyCall(fw_, method, std::forward<Args>(args)...);
    return c10::make_intrusive<ForwardedWork>(work, fw_, std::move(outputs), type, getRank());
  }

  py::object comm_;
  py::object fw_;
  std::string name_;
};

}  // namespace torchcomms_ext

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch._C._distributed_c10d");  // registers c10d::Backend, our base
  py::register_exception_translator(&torchcomms_ext::translatePyErrorValue);
  py::class_<torchcomms_ext::BackendWrapper, c10d::Backend, c10::intrusive_ptr<torchcomms_ext::BackendWrapper>>(
      m, "_BackendWrapper",
      "A c10d Backend over a torchcomms communicator: every op goes through the communicator's dispatch path.")
      .def(py::init([](py::object comm) { return c10::make_intrusive<torchcomms_ext::BackendWrapper>(comm); }),
           py::arg("comm"))
      .def("get_comm", &torchcomms_ext::BackendWrapper::getComm, "The communicator this backend forwards to.")
      // c10d's process-group helper calls it (as on ProcessGroupNCCL, which binds it) on the ranks
      // left out of a group it makes while the default group has a bound device (its "split
      // source"), for them to join an ncclCommSplit of the members. On the route the members make
      // a new communicator over the store and split nothing, so the ranks left out have nothing
      // to join (without it they raised AttributeError).
      .def(
          "perform_nocolor_split", [](torchcomms_ext::BackendWrapper&, const py::object&) {}, py::arg("device"),
          "Nothing: the members of a group c10d's helper makes on the route split no communicator.")
      .def_property_readonly("options", &torchcomms_ext::BackendWrapper::options,
                             "c10d's options of this group's backend: the communicator's timeout, the group's "
                             "name and global ranks, the engine's own fields.")
      // c10d's _set_pg_timeout(timeout, group) calls this on the group's backends (on
      // ProcessGroupGloo / ProcessGroupNCCL, which bind it, and on this class by name)
      .def(
          "_set_default_timeout",
          [](torchcomms_ext::BackendWrapper& self, const py::object& timeout) {
            auto ms = static_cast<int64_t>(timeout.attr("total_seconds")().cast<double>() * 1000.0);
            self.setTimeout(std::chrono::milliseconds(ms));
          },
          py::arg("timeout"),
          "The communicator's timeout for every later op (a datetime.timedelta).");
}
