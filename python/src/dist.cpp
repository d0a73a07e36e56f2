// kiln.distributed (kiln._C._dist): communicators, Work, ReduceOp and the two exceptions.
// Tensors are kiln.Tensor or anything with __dlpack__ (torch, NumPy), viewed zero-copy through
// kiln.from_dlpack, so results land in the caller's own memory. Blocking calls release the GIL;
// the semantics (queueing, checks, timeouts) live in kiln::dist.
#include <nanobind/stl/shared_ptr.h>

#include <chrono>
#include <cmath>

#include "bind.h"
#include "kiln/dist.h"
#include "kiln/error.h"

namespace kiln::py {
namespace {

namespace kd = kiln::dist;
using std::chrono::milliseconds;

// A kiln.Tensor as is; any DLPack producer as a kiln view of its memory (in place stays in place).
Tensor tensor_arg(nb::handle obj, const char* op, const char* what) {
  if (nb::isinstance<Tensor>(obj)) return nb::cast<Tensor>(obj);
  if (!nb::hasattr(obj, "__dlpack__"))
    throw nb::type_error((std::string("[") + op + "] " + what + " must be a kiln.Tensor or an object with "
                          "__dlpack__ (a torch tensor, a NumPy array), got " +
                          nb::type_name(obj.type()).c_str())
                             .c_str());
  return nb::cast<Tensor>(nb::module_::import_("kiln._dlpack").attr("from_dlpack")(obj));
}

// Seconds as a float or int, or a datetime.timedelta (torch's convention).
milliseconds seconds_arg(nb::handle value, const char* op) {
  double s = 0;
  if (nb::hasattr(value, "total_seconds")) s = nb::cast<double>(value.attr("total_seconds")());
  else if (PyFloat_Check(value.ptr()) || (PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr())))
    s = nb::cast<double>(value);
  else throw nb::type_error((std::string("[") + op + "] timeout must be seconds (a number) or a timedelta").c_str());
  KILN_CHECK(std::isfinite(s) && s > 0, op, "timeout must be positive, got ", s, " s");
  return milliseconds(static_cast<int64_t>(std::ceil(s * 1000.0)));
}

nb::object work_or_none(std::shared_ptr<kd::Work> w, bool async_op) {
  return async_op ? nb::cast(std::move(w)) : nb::none();
}

// f(comm, args...) -> Work with the GIL released; None unless async_op.
template <typename F>
nb::object blocking(bool async_op, F&& f) {
  std::shared_ptr<kd::Work> w;
  {
    nb::gil_scoped_release release;
    w = f();
  }
  return work_or_none(std::move(w), async_op);
}

// Destroying a communicator waits for its threads (up to the running op's deadline): without the
// GIL, so a worker that needs it (a NumPy buffer's DLPack deleter) never waits on this thread.
std::shared_ptr<kd::Communicator> py_owned(std::shared_ptr<kd::Communicator> c) {
  if (!c) return c;
  kd::Communicator* raw = c.get();
  return std::shared_ptr<kd::Communicator>(raw, [keep = std::move(c)](kd::Communicator*) mutable {
    nb::gil_scoped_release release;
    keep.reset();
  });
}

void bind_work(nb::module_& d) {
  nb::enum_<kd::WorkStatus>(d, "WorkStatus")
      .value("NOT_STARTED", kd::WorkStatus::NOT_STARTED)
      .value("IN_PROGRESS", kd::WorkStatus::IN_PROGRESS)
      .value("COMPLETED", kd::WorkStatus::COMPLETED)
      .value("TIMED_OUT", kd::WorkStatus::TIMED_OUT)
      .value("ERROR", kd::WorkStatus::ERROR);
  nb::enum_<kd::ReduceOp>(d, "ReduceOp")
      .value("SUM", kd::ReduceOp::SUM)
      .value("AVG", kd::ReduceOp::AVG)
      .value("MIN", kd::ReduceOp::MIN)
      .value("MAX", kd::ReduceOp::MAX)
      .value("PRODUCT", kd::ReduceOp::PRODUCT);

  nb::class_<kd::Work>(d, "Work", "One operation of a communicator (returned with async_op=True).")
      .def(
          "wait",
          [](kd::Work& w, nb::handle timeout) {
            if (timeout.is_none()) {
              nb::gil_scoped_release release;
              w.wait();
            } else {
              const milliseconds t = seconds_arg(timeout, "wait");
              nb::gil_scoped_release release;
              w.wait(t);
            }
          },
          "timeout"_a = nb::none(),
          "Blocks until the op ended and raises its error. With a timeout (seconds or timedelta), an op still "
          "running then times out: TIMED_OUT, the communicator is aborted, TimeoutError.")
      .def("is_completed", &kd::Work::is_completed, "The op ended, successfully or not.")
      .def_prop_ro("status", &kd::Work::status)
      .def_prop_ro("seq", &kd::Work::seq, "The op's sequence number in its communicator.")
      .def_prop_ro("op", &kd::Work::op)
      .def("__repr__", [](const kd::Work& w) {
        return "<kiln.distributed.Work " + w.op() + " seq " + std::to_string(w.seq()) + " " +
               kd::work_status_name(w.status()) + ">";
      });
}

void bind_communicator(nb::module_& d) {
  using C = kd::Communicator;
  nb::class_<C>(d, "Communicator",
                "A group of ranks running collectives in the same order (made by kiln.distributed.new_comm).")
      .def("get_rank", &C::get_rank)
      .def("get_size", &C::get_size)
      .def("get_name", &C::get_name)
      .def("get_backend", &C::get_backend)
      .def("get_device", &C::get_device)
      .def("is_aborted", &C::is_aborted)
      .def("get_timeout", [](const C& c) { return static_cast<double>(c.get_options().timeout.count()) / 1000.0; },
           "The timeout of ops called from now on, in seconds.")
      .def("set_timeout", [](C& c, nb::handle t) { c.set_timeout(seconds_arg(t, "set_timeout")); }, "timeout"_a)
      .def("set_abort_process_on_error", &C::set_abort_process_on_error, "abort_process"_a)
      .def(
          "all_reduce",
          [](C& c, nb::handle t, kd::ReduceOp op, bool async_op) {
            Tensor x = tensor_arg(t, "all_reduce", "the tensor");
            return blocking(async_op, [&] { return c.all_reduce(x, op, async_op); });
          },
          "tensor"_a, "op"_a = kd::ReduceOp::SUM, "async_op"_a = false, "tensor: any shape, reduced in place.")
      .def(
          "all_gather_single",
          [](C& c, nb::handle out, nb::handle in, bool async_op) {
            Tensor o = tensor_arg(out, "all_gather_single", "output");
            Tensor i = tensor_arg(in, "all_gather_single", "input");
            return blocking(async_op, [&] { return c.all_gather_single(o, i, async_op); });
          },
          "output"_a, "input"_a, "async_op"_a = false,
          "input: n elements; output: size * n, rank r's input at [r * n, (r + 1) * n).")
      .def(
          "reduce_scatter_single",
          [](C& c, nb::handle out, nb::handle in, kd::ReduceOp op, bool async_op) {
            Tensor o = tensor_arg(out, "reduce_scatter_single", "output");
            Tensor i = tensor_arg(in, "reduce_scatter_single", "input");
            return blocking(async_op, [&] { return c.reduce_scatter_single(o, i, op, async_op); });
          },
          "output"_a, "input"_a, "op"_a = kd::ReduceOp::SUM, "async_op"_a = false,
          "input: size * n elements; output: n, block r of the reduction on rank r.")
      .def(
          "broadcast",
          [](C& c, nb::handle t, int root, bool async_op) {
            Tensor x = tensor_arg(t, "broadcast", "the tensor");
            return blocking(async_op, [&] { return c.broadcast(x, root, async_op); });
          },
          "tensor"_a, "root"_a, "async_op"_a = false)
      .def(
          "all_to_all_single",
          [](C& c, nb::handle out, nb::handle in, bool async_op) {
            Tensor o = tensor_arg(out, "all_to_all_single", "output");
            Tensor i = tensor_arg(in, "all_to_all_single", "input");
            return blocking(async_op, [&] { return c.all_to_all_single(o, i, async_op); });
          },
          "output"_a, "input"_a, "async_op"_a = false,
          "input, output: size * n elements; block j of rank i's input lands in block i of rank j's output.")
      .def(
          "send",
          [](C& c, nb::handle t, int dst, bool async_op) {
            Tensor x = tensor_arg(t, "send", "the tensor");
            return blocking(async_op, [&] { return c.send(x, dst, async_op); });
          },
          "tensor"_a, "dst"_a, "async_op"_a = false)
      .def(
          "recv",
          [](C& c, nb::handle t, int src, bool async_op) {
            Tensor x = tensor_arg(t, "recv", "the tensor");
            return blocking(async_op, [&] { return c.recv(x, src, async_op); });
          },
          "tensor"_a, "src"_a, "async_op"_a = false)
      .def(
          "barrier", [](C& c, bool async_op) { return blocking(async_op, [&] { return c.barrier(async_op); }); },
          "async_op"_a = false)
      .def(
          "split",
          [](C& c, const std::vector<int>& ranks, const std::string& name) {
            std::shared_ptr<C> r;
            {
              nb::gil_scoped_release release;
              r = c.split(ranks, name);
            }
            return py_owned(std::move(r));
          },
          "ranks"_a, "name"_a,
          "A communicator over `ranks` (this one's numbering), called by every rank; None on ranks not listed.")
      .def(
          "shrink",
          [](C& c, const std::vector<int>& exclude_ranks, const std::string& name) {
            std::shared_ptr<C> r;
            {
              nb::gil_scoped_release release;
              r = c.shrink(exclude_ranks, name);
            }
            return py_owned(std::move(r));
          },
          "exclude_ranks"_a, "name"_a = "",
           "The survivors without exclude_ranks, renumbered in order; called by every survivor, also after an "
           "error (the way on after a TimeoutError or CommError).")
      .def("abort", &C::abort, nb::call_guard<nb::gil_scoped_release>())
      .def("dump_flight_recorder", &C::dump_flight_recorder, "path"_a = "",
           "Writes the flight recorder as JSON (default <trace_dir>/<name>.rank<r>.json); returns the path.")
      .def("__repr__", [](const C& c) {
        return "<kiln.distributed.Communicator '" + c.get_name() + "' rank " + std::to_string(c.get_rank()) + " of " +
               std::to_string(c.get_size()) + " (" + c.get_backend() + ", " + c.get_device().str() + ")>";
      });
}

}  // namespace

void bind_dist(nb::module_& m) {
  nb::module_ d = m.def_submodule("_dist", "kiln::dist: communicators over Gloo and NCCL");
  // Translators run newest first: TimeoutError before CommError before KilnError.
  static nb::exception<kd::CommError> comm_error(d, "CommError", m.attr("KilnError"));
  static nb::exception<kd::TimeoutError> timeout_error(d, "TimeoutError", comm_error);
  bind_work(d);
  bind_communicator(d);

  d.def(
      "new_comm",
      [](const std::string& backend, Device device, const std::string& name, nb::handle timeout,
         bool abort_process_on_error, bool check_inputs, const std::string& trace_dir, size_t trace_capacity,
         const std::string& log_path, const std::string& hostname) {
        kd::CommOptions o;
        o.timeout = seconds_arg(timeout, "new_comm");
        o.abort_process_on_error = abort_process_on_error;
        o.check_inputs = check_inputs;
        o.trace_dir = trace_dir;
        o.trace_capacity = trace_capacity;
        o.log_path = log_path;
        o.hostname = hostname;
        std::shared_ptr<kd::Communicator> c;
        {
          nb::gil_scoped_release release;
          c = kd::new_comm(backend, device, name, o);
        }
        return py_owned(std::move(c));
      },
      "backend"_a, "device"_a = "cpu", "name"_a = "main", nb::kw_only(), "timeout"_a = 30.0,
      "abort_process_on_error"_a = false, "check_inputs"_a = true, "trace_dir"_a = "kiln_trace",
      "trace_capacity"_a = 2048, "log_path"_a = "", "hostname"_a = "");
  d.def("dump_flight_recorders", &kd::dump_flight_recorders, nb::call_guard<nb::gil_scoped_release>());
  d.def("enable_dump_on_signal", &kd::enable_dump_on_signal, "signum"_a = SIGUSR1);
}

}  // namespace kiln::py
