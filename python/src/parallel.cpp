// kiln.set_num_threads / kiln.get_num_threads (torch's names): the CPU threads of large ops.
#include "bind.h"
#include "kiln/parallel.h"

namespace kiln::py {

void bind_parallel(nb::module_& m) {
  m.def("set_num_threads", [](int n) {
    if (n < 1) throw nb::value_error(("set_num_threads: the number of threads must be positive, got " +
                                      std::to_string(n)).c_str());
    set_num_threads(n);
  }, "int"_a, "Sets the number of threads large CPU ops use (small ops always run on the calling thread).");
  m.def("get_num_threads", &get_num_threads, "The number of threads large CPU ops use.");
}

}  // namespace kiln::py
