// FlexAttention: the mod IR as a Python type (flex Expr with Python operators), tracing of Python
// score_mod / mask_mod functions into that IR, BlockMask, create_block_mask and flex_attention.
//
// Tracing: a Python mod is called once with symbolic leaves (b, h, q_idx, kv_idx, score); every
// operator on them builds kiln::flex::Expr nodes, and indexing a captured kiln.Tensor with an
// expression becomes a load. Anything needing a concrete value (if / and / or / not / int() /
// indexing a list) reaches __bool__ / __index__, which raise a KilnError naming the line.
#include "bind.h"
#include "kiln/flex.h"
#include "kiln/ops.h"

namespace kiln::py {
namespace {

namespace fx = kiln::flex;

std::optional<fx::Expr> try_expr(nb::handle h) {
  if (nb::isinstance<fx::Expr>(h)) return nb::cast<fx::Expr>(h);
  if (PyBool_Check(h.ptr())) return fx::Expr(h.ptr() == Py_True);
  if (PyLong_Check(h.ptr())) return fx::Expr(nb::cast<int64_t>(h));
  if (PyFloat_Check(h.ptr())) return fx::Expr(nb::cast<double>(h));
  return std::nullopt;
}

fx::Expr to_expr(nb::handle h, const char* what) {
  auto e = try_expr(h);
  KILN_CHECK(e.has_value(), "flex", what, " must be an index expression or a Python number, got ",
             Py_TYPE(h.ptr())->tp_name, " at ", python_location(),
             " (a tensor can only appear indexed by index expressions, e.g. bias[h][q_idx - kv_idx])");
  return *e;
}

[[noreturn]] void not_traceable(const char* what) {
  KILN_FAIL("flex", "a mod used an index expression as ", what, " at ", python_location(),
            ": data-dependent Python control flow cannot be traced into kiln's IR; use & | ~ instead of "
            "and / or / not, and kiln.where(cond, x, y) instead of if");
}

const char* kind_name(fx::Kind k) {
  return k == fx::Kind::Int ? "int" : k == fx::Kind::Float ? "float" : "bool";
}

fx::Expr true_div(const fx::Expr& a, const fx::Expr& b) {
  // Python's / is true division; the IR's int / int floors (that is Python's //).
  if (a.kind() == fx::Kind::Int && b.kind() == fx::Kind::Int) return (a * fx::Expr(1.0)) / b;
  return a / b;
}

fx::Expr floor_div(const fx::Expr& a, const fx::Expr& b) {
  // Python's //: the IR's int / int floors; floats floor the true quotient.
  if (a.kind() == fx::Kind::Int && b.kind() == fx::Kind::Int) return a / b;
  return fx::floor(true_div(a, b));
}

bool is_leaf(const fx::Expr& e, fx::Op op) { return e.node()->op == op; }

// Calling a built-in mod inside a traced Python mod: its expression, when given the leaves.
fx::Expr call_mod(const fx::Expr& expr, const std::vector<fx::Expr>& args, const std::vector<fx::Op>& leaves) {
  for (size_t i = 0; i < args.size(); ++i)
    KILN_CHECK(is_leaf(args[i], leaves[i]), "flex",
               "a built-in mod can only be called with the mod's own arguments (b, h, q_idx, kv_idx[, score])");
  return expr;
}

// Runs one step of building a traced expression; a kind error (int & int, sign of a bool, ...)
// names the line of the mod that made it.
template <typename F>
auto at_line(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find(" at ") != std::string::npos) throw;
    throw Error(msg + " at " + python_location());
  }
}

template <typename F>
void def_bin(nb::class_<fx::Expr>& cls, const char* name, const char* rname, F f) {
  cls.def(name, [f](const fx::Expr& a, nb::handle b) -> nb::object {
    auto e = try_expr(b);
    if (!e) return nb::borrow(Py_NotImplemented);
    return nb::cast(at_line([&] { return f(a, *e); }));
  }, nb::is_operator());
  if (rname)
    cls.def(rname, [f](const fx::Expr& a, nb::handle b) -> nb::object {
      auto e = try_expr(b);
      if (!e) return nb::borrow(Py_NotImplemented);
      return nb::cast(at_line([&] { return f(*e, a); }));
    }, nb::is_operator());
}

// The Expr type a dtype converts to ("float", "int" or "bool"): kiln dtypes, torch dtypes and the
// Python types float / int / bool, by name (torch.float32 -> "torch.float32").
fx::Kind kind_of_dtype(nb::handle dtype) {
  if (dtype.ptr() == reinterpret_cast<PyObject*>(&PyFloat_Type)) return fx::Kind::Float;
  if (dtype.ptr() == reinterpret_cast<PyObject*>(&PyLong_Type)) return fx::Kind::Int;
  if (dtype.ptr() == reinterpret_cast<PyObject*>(&PyBool_Type)) return fx::Kind::Bool;
  std::string n = nb::str(dtype).c_str();
  if (const size_t dot = n.rfind('.'); dot != std::string::npos) n = n.substr(dot + 1);
  if (n == "bool") return fx::Kind::Bool;
  if (n.find("float") != std::string::npos || n == "half" || n == "double") return fx::Kind::Float;
  if (n.find("int") != std::string::npos || n == "long" || n == "short") return fx::Kind::Int;
  KILN_FAIL("flex", "a mod converted an index expression to ", n, " at ", python_location(),
            "; traced expressions convert to float, int or bool dtypes");
}

fx::Expr convert(const fx::Expr& a, fx::Kind k) {
  if (k == fx::Kind::Float) return fx::to_float(a);
  if (k == fx::Kind::Int) return fx::to_int(a);
  return a.kind() == fx::Kind::Bool ? a : a != fx::Expr(0);
}

// torch.clamp(x, min, max): either bound may be None.
fx::Expr clamp_expr(const fx::Expr& x, nb::handle lo, nb::handle hi) {
  fx::Expr r = x;
  if (!lo.is_none()) r = fx::max(r, to_expr(lo, "clamp's min"));
  if (!hi.is_none()) r = fx::min(r, to_expr(hi, "clamp's max"));
  return r;
}

// The tensor methods of torch that a score_mod / mask_mod reaches for, on traced expressions.
void bind_expr_methods(nb::class_<fx::Expr>& ex) {
  using E = const fx::Expr&;
  auto unary = [&ex](const char* name, fx::Expr (*f)(E)) {
    ex.def(name, [f](E a) { return at_line([&] { return f(a); }); });
  };
  unary("abs", &fx::abs);
  unary("sign", &fx::sign);
  unary("exp", &fx::exp);
  unary("log", &fx::log);
  unary("tanh", &fx::tanh);
  unary("sigmoid", &fx::sigmoid);
  unary("floor", &fx::floor);
  unary("float", &fx::to_float);
  unary("long", &fx::to_int);
  unary("int", &fx::to_int);
  ex.def("neg", [](E a) { return at_line([&] { return -a; }); })
      .def("bool", [](E a) { return at_line([&] { return convert(a, fx::Kind::Bool); }); })
      .def("logical_not", [](E a) { return at_line([&] { return !convert(a, fx::Kind::Bool); }); })
      .def("to", [](E a, nb::handle dtype) { return at_line([&] { return convert(a, kind_of_dtype(dtype)); }); },
           "dtype"_a)
      .def("type", [](E a, nb::handle dtype) { return at_line([&] { return convert(a, kind_of_dtype(dtype)); }); },
           "dtype"_a)
      .def("clamp", [](E a, nb::handle lo, nb::handle hi) { return at_line([&] { return clamp_expr(a, lo, hi); }); },
           "min"_a = nb::none(), "max"_a = nb::none())
      .def("clamp_min", [](E a, nb::handle lo) { return at_line([&] { return clamp_expr(a, lo, nb::none()); }); }, "min"_a)
      .def("clamp_max", [](E a, nb::handle hi) { return at_line([&] { return clamp_expr(a, nb::none(), hi); }); }, "max"_a)
      .def("where", [](E a, E cond, nb::handle other) {  // torch: self where cond, else other
        return at_line([&] { return fx::where(cond, a, to_expr(other, "where's other")); });
      }, "condition"_a, "other"_a);
  auto binary = [&ex](const char* name, fx::Expr (*f)(E, E)) {
    ex.def(name, [f](E a, nb::handle b) { return at_line([&] { return f(a, to_expr(b, "the other operand")); }); },
           "other"_a);
  };
  binary("minimum", [](E a, E b) { return fx::min(a, b); });
  binary("maximum", [](E a, E b) { return fx::max(a, b); });
  binary("remainder", [](E a, E b) { return a % b; });
  binary("floor_divide", [](E a, E b) { return floor_div(a, b); });
  binary("div", &true_div);
  binary("true_divide", &true_div);
  binary("add", [](E a, E b) { return a + b; });
  binary("sub", [](E a, E b) { return a - b; });
  binary("mul", [](E a, E b) { return a * b; });
  binary("eq", [](E a, E b) { return a == b; });
  binary("ne", [](E a, E b) { return a != b; });
  binary("lt", [](E a, E b) { return a < b; });
  binary("le", [](E a, E b) { return a <= b; });
  binary("gt", [](E a, E b) { return a > b; });
  binary("ge", [](E a, E b) { return a >= b; });
  binary("logical_and", [](E a, E b) { return convert(a, fx::Kind::Bool) & convert(b, fx::Kind::Bool); });
  binary("logical_or", [](E a, E b) { return convert(a, fx::Kind::Bool) | convert(b, fx::Kind::Bool); });
}

// Calls a mod with symbolic arguments through kiln/_capture.py (NumPy captures rebound, errors
// from indexing uncapturable objects re-raised naming the line).
nb::object call_traced(nb::handle f, nb::tuple args) {
  return nb::module_::import_("kiln._capture").attr("call")(f, args);
}

// A traced mod's return value as an Expr; otherwise an error naming where the mod is defined.
fx::Expr result_expr(nb::handle f, nb::handle r, const char* what) {
  if (auto e = try_expr(r)) return *e;
  nb::str where = nb::borrow<nb::str>(nb::module_::import_("kiln._capture").attr("definition")(f));
  KILN_FAIL("flex", what, " defined at ", std::string(where.c_str()), " returned ", Py_TYPE(r.ptr())->tp_name,
            "; it must return an expression of its arguments (a tensor can only appear indexed by index "
            "expressions, e.g. bias[h][q_idx - kv_idx])");
}

}  // namespace

// Where in the user's Python code tracing hit a data-dependent construct.
std::string python_location() {
  // The innermost Python frame outside kiln/_capture.py (which forwards torch indexing to kiln).
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  nb::object keep;                           // owns frames returned by PyFrame_GetBack
  std::string file = "<unknown>";
  while (frame) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    file = "<unknown>";
    if (PyObject* f = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_filename")) {
      if (const char* s = PyUnicode_AsUTF8(f)) file = s;
      Py_DECREF(f);
    }
    PyErr_Clear();
    Py_DECREF(code);
    const std::string tail = "_capture.py";
    if (file.size() < tail.size() || file.compare(file.size() - tail.size(), tail.size(), tail) != 0) break;
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference (or null)
    keep = nb::steal(reinterpret_cast<PyObject*>(back));
    frame = back;
  }
  if (!frame) return "<unknown>";
  return file + ":" + std::to_string(PyFrame_GetLineNumber(frame));
}

fx::MaskMod as_mask_mod(nb::handle f) {
  if (f.is_none()) return fx::noop_mask();
  if (nb::isinstance<fx::MaskMod>(f)) return nb::cast<fx::MaskMod>(f);
  KILN_CHECK(PyCallable_Check(f.ptr()), "flex", "mask_mod must be a MaskMod or a function (b, h, q_idx, kv_idx) -> bool");
  nb::object r = call_traced(f, nb::make_tuple(fx::b(), fx::h(), fx::q_idx(), fx::kv_idx()));
  fx::Expr e = result_expr(f, r, "mask_mod");
  KILN_CHECK(e.kind() == fx::Kind::Bool, "flex", "mask_mod must return a bool expression, got ", kind_name(e.kind()),
             ": ", fx::to_string(e));
  return fx::MaskMod(e);
}

fx::ScoreMod as_score_mod(nb::handle f) {
  if (f.is_none()) return fx::ScoreMod();
  if (nb::isinstance<fx::ScoreMod>(f)) return nb::cast<fx::ScoreMod>(f);
  KILN_CHECK(PyCallable_Check(f.ptr()), "flex",
             "score_mod must be a ScoreMod or a function (score, b, h, q_idx, kv_idx) -> score");
  nb::object r = call_traced(f, nb::make_tuple(fx::score(), fx::b(), fx::h(), fx::q_idx(), fx::kv_idx()));
  fx::Expr e = result_expr(f, r, "score_mod");
  KILN_CHECK(e.kind() != fx::Kind::Bool, "flex", "score_mod must return a number expression, got bool: ", fx::to_string(e));
  if (e.kind() == fx::Kind::Int) e = e * fx::Expr(1.0);
  return fx::ScoreMod(e);
}

void bind_flex(nb::module_& m) {
  auto ex = nb::class_<fx::Expr>(m, "Expr", "A symbolic value in a traced score_mod / mask_mod (kiln's flex IR).");
  def_bin(ex, "__add__", "__radd__", [](const fx::Expr& a, const fx::Expr& b) { return a + b; });
  def_bin(ex, "__sub__", "__rsub__", [](const fx::Expr& a, const fx::Expr& b) { return a - b; });
  def_bin(ex, "__mul__", "__rmul__", [](const fx::Expr& a, const fx::Expr& b) { return a * b; });
  def_bin(ex, "__truediv__", "__rtruediv__", &true_div);
  def_bin(ex, "__floordiv__", "__rfloordiv__", &floor_div);
  def_bin(ex, "__mod__", "__rmod__", [](const fx::Expr& a, const fx::Expr& b) { return a % b; });
  def_bin(ex, "__lt__", nullptr, [](const fx::Expr& a, const fx::Expr& b) { return a < b; });
  def_bin(ex, "__le__", nullptr, [](const fx::Expr& a, const fx::Expr& b) { return a <= b; });
  def_bin(ex, "__gt__", nullptr, [](const fx::Expr& a, const fx::Expr& b) { return a > b; });
  def_bin(ex, "__ge__", nullptr, [](const fx::Expr& a, const fx::Expr& b) { return a >= b; });
  def_bin(ex, "__eq__", nullptr, [](const fx::Expr& a, const fx::Expr& b) { return a == b; });
  def_bin(ex, "__ne__", nullptr, [](const fx::Expr& a, const fx::Expr& b) { return a != b; });
  def_bin(ex, "__and__", "__rand__", [](const fx::Expr& a, const fx::Expr& b) { return a & b; });
  def_bin(ex, "__or__", "__ror__", [](const fx::Expr& a, const fx::Expr& b) { return a | b; });
  ex.def("__neg__", [](const fx::Expr& a) { return at_line([&] { return -a; }); })
      .def("__pos__", [](const fx::Expr& a) { return a; })
      .def("__invert__", [](const fx::Expr& a) { return at_line([&] { return !a; }); })
      .def("__abs__", [](const fx::Expr& a) { return at_line([&] { return fx::abs(a); }); })
      .def("__getitem__", [](const fx::Expr& a, nb::handle i) { return at_line([&] { return a[to_expr(i, "an index")]; }); })
      .def("__bool__", [](const fx::Expr&) -> bool { not_traceable("a Python bool (if / and / or / not / a < b < c)"); })
      .def("__index__", [](const fx::Expr&) -> int64_t {
        KILN_FAIL("flex", "a mod used an index expression as a concrete int at ", python_location(),
                  ": indexing a Python list / tuple, or a NumPy array the tracer cannot see (it rebinds arrays "
                  "read from the mod's closure or globals), needs a concrete index; capture a kiln tensor, a "
                  "torch tensor or a NumPy array in the closure, or use kiln.where instead of control flow");
      })
      .def("__int__", [](const fx::Expr&) -> int64_t { not_traceable("a concrete int"); })
      .def("__len__", [](const fx::Expr&) -> int64_t {
        KILN_FAIL("flex", "a mod indexed something that is not a kiln tensor with an index expression at ",
                  python_location(), "; capture kiln tensors, torch tensors or NumPy arrays");
      })
      .def("__float__", [](const fx::Expr&) -> double { not_traceable("a concrete float"); })
      .def("__hash__", [](const fx::Expr& a) { return reinterpret_cast<uintptr_t>(a.node().get()); })
      .def("__repr__", [](const fx::Expr& a) { return fx::to_string(a); })
      .def_prop_ro("kind", [](const fx::Expr& a) { return kind_name(a.kind()); })
      .def_prop_ro("reads_tensors", &fx::Expr::reads_tensors)
      .def_prop_ro("captured_tensors", [](const fx::Expr& a) { return fx::captured_tensors(a); },
                   "the tensors the expression loads from (each once)");
  bind_expr_methods(ex);

  // Function forms on expressions (overloads next to the tensor ops of the same names).
  m.def("where", [](const fx::Expr& c, nb::handle x, nb::handle y) {
    return at_line([&] { return fx::where(c, to_expr(x, "where's x"), to_expr(y, "where's y")); });
  }, "condition"_a, "input"_a, "other"_a);
  m.def("minimum", [](const fx::Expr& a, nb::handle b) {
    return at_line([&] { return fx::min(a, to_expr(b, "minimum's other")); });
  }, "input"_a, "other"_a);
  m.def("maximum", [](const fx::Expr& a, nb::handle b) {
    return at_line([&] { return fx::max(a, to_expr(b, "maximum's other")); });
  }, "input"_a, "other"_a);
  m.def("clamp", [](const fx::Expr& a, nb::handle lo, nb::handle hi) { return at_line([&] { return clamp_expr(a, lo, hi); }); },
        "input"_a, "min"_a = nb::none(), "max"_a = nb::none());
  m.def("remainder", [](const fx::Expr& a, nb::handle b) {
    return at_line([&] { return a % to_expr(b, "remainder's other"); });
  }, "input"_a, "other"_a);
  for (auto [name, f] : {std::pair{"abs", &fx::abs}, std::pair{"sign", &fx::sign}, std::pair{"tanh", &fx::tanh},
                         std::pair{"exp", &fx::exp}, std::pair{"log", &fx::log}, std::pair{"sigmoid", &fx::sigmoid},
                         std::pair{"floor", &fx::floor}})
    m.def(name, [f](const fx::Expr& a) { return at_line([&] { return f(a); }); }, "input"_a);

  nb::class_<fx::MaskMod>(m, "MaskMod", "mask_mod(b, h, q_idx, kv_idx) -> bool, as kiln IR")
      .def("__init__", [](fx::MaskMod* self, nb::handle f) { new (self) fx::MaskMod(as_mask_mod(f)); }, "fn"_a)
      .def("__call__", [](const fx::MaskMod& mm, const fx::Expr& b, const fx::Expr& h, const fx::Expr& q, const fx::Expr& kv) {
        return call_mod(mm.expr, {b, h, q, kv}, {fx::Op::B, fx::Op::H, fx::Op::QIdx, fx::Op::KvIdx});
      }, "b"_a, "h"_a, "q_idx"_a, "kv_idx"_a)
      .def_prop_ro("expr", [](const fx::MaskMod& mm) { return mm.expr; })
      .def("__repr__", [](const fx::MaskMod& mm) { return "MaskMod(" + mm.to_string() + ")"; });
  nb::class_<fx::ScoreMod>(m, "ScoreMod", "score_mod(score, b, h, q_idx, kv_idx) -> score, as kiln IR")
      .def("__init__", [](fx::ScoreMod* self, nb::handle f) { new (self) fx::ScoreMod(as_score_mod(f)); }, "fn"_a)
      .def("__call__", [](const fx::ScoreMod& sm, const fx::Expr& s, const fx::Expr& b, const fx::Expr& h,
                          const fx::Expr& q, const fx::Expr& kv) {
        return call_mod(sm.expr, {s, b, h, q, kv}, {fx::Op::Score, fx::Op::B, fx::Op::H, fx::Op::QIdx, fx::Op::KvIdx});
      }, "score"_a, "b"_a, "h"_a, "q_idx"_a, "kv_idx"_a)
      .def_prop_ro("expr", [](const fx::ScoreMod& sm) { return sm.expr; })
      .def("__repr__", [](const fx::ScoreMod& sm) { return "ScoreMod(" + sm.to_string() + ")"; });

  auto mask_list = [](nb::args mods) {
    std::vector<fx::MaskMod> out;
    for (nb::handle h : mods) out.push_back(as_mask_mod(h));
    return out;
  };
  m.def("and_masks", [mask_list](nb::args mods) { return fx::and_masks(mask_list(mods)); }, "mask_mods"_a);
  m.def("or_masks", [mask_list](nb::args mods) { return fx::or_masks(mask_list(mods)); }, "mask_mods"_a);
  m.def("noop_mask", &fx::noop_mask);
  m.def("causal_mask", &fx::causal_mask, "q_idx >= kv_idx");
  m.def("sliding_window_mask", &fx::sliding_window_mask, "window"_a, "causal and q_idx - kv_idx < window");
  m.def("document_mask", &fx::document_mask, "doc_ids"_a, "doc_ids [L] int: doc[q_idx] == doc[kv_idx]");
  m.def("prefix_lm_mask", &fx::prefix_lm_mask, "prefix"_a, "kv_idx < prefix | q_idx >= kv_idx");
  m.def("chunked_mask", &fx::chunked_mask, "chunk"_a, "q_idx // chunk == kv_idx // chunk");
  m.def("alibi", &fx::alibi, "slopes"_a, "slopes [H]: score + slopes[h] * (kv_idx - q_idx)");
  m.def("softcap", &fx::softcap, "cap"_a, "cap * tanh(score / cap)");
  m.def("relative_position_bias", &fx::relative_position_bias, "bias"_a, "offset"_a,
        "bias [H, n] (learned): score + bias[h][q_idx - kv_idx + offset]");
  m.def("_flex_leaves", [] { return nb::make_tuple(fx::score(), fx::b(), fx::h(), fx::q_idx(), fx::kv_idx()); });

  nb::class_<fx::BlockMask>(m, "BlockMask", "Per (b, h, q-block) the kv blocks to compute (PyTorch's BlockMask).")
      .def_ro("kv_num_blocks", &fx::BlockMask::kv_num_blocks)
      .def_ro("kv_indices", &fx::BlockMask::kv_indices)
      .def_ro("full_kv_num_blocks", &fx::BlockMask::full_kv_num_blocks)
      .def_ro("full_kv_indices", &fx::BlockMask::full_kv_indices)
      .def_ro("q_num_blocks", &fx::BlockMask::q_num_blocks)
      .def_ro("q_indices", &fx::BlockMask::q_indices)
      .def_ro("full_q_num_blocks", &fx::BlockMask::full_q_num_blocks)
      .def_ro("full_q_indices", &fx::BlockMask::full_q_indices)
      .def_prop_ro("BLOCK_SIZE", [](const fx::BlockMask& bm) { return std::make_pair(bm.q_block_size, bm.kv_block_size); })
      .def_ro("mask_mod", &fx::BlockMask::mask_mod)
      .def_prop_ro("shape", [](const fx::BlockMask& bm) { return nb::tuple(nb::cast(bm.shape())); })
      .def_prop_ro("seq_lengths", [](const fx::BlockMask& bm) { return std::make_pair(bm.q_len, bm.kv_len); })
      .def("sparsity", &fx::BlockMask::sparsity, "percent of blocks not computed")
      .def("to_dense", &fx::BlockMask::to_dense, "[B, H, nQ, nKV] int32, 1 where a block is computed")
      .def("to_string", &fx::BlockMask::to_string)
      .def_prop_ro("nbytes", &fx::BlockMask::nbytes)
      .def("__repr__", &fx::BlockMask::to_string)
      .def_static("from_kv_blocks", [](const Tensor& kv_num_blocks, const Tensor& kv_indices,
                                       std::optional<Tensor> full_kv_num_blocks, std::optional<Tensor> full_kv_indices,
                                       int64_t q_len, int64_t kv_len, int64_t block_size, nb::handle mask_mod) {
        return fx::BlockMask::from_kv_blocks(kv_num_blocks, kv_indices, full_kv_num_blocks.value_or(Tensor()),
                                             full_kv_indices.value_or(Tensor()), q_len, kv_len, block_size,
                                             as_mask_mod(mask_mod));
      }, "kv_num_blocks"_a, "kv_indices"_a, "full_kv_num_blocks"_a = nb::none(), "full_kv_indices"_a = nb::none(),
      "q_len"_a, "kv_len"_a, "BLOCK_SIZE"_a = 128, "mask_mod"_a = nb::none());

  m.def("create_block_mask", [](nb::handle mask_mod, std::optional<int64_t> B, std::optional<int64_t> H, int64_t Q_LEN,
                                int64_t KV_LEN, std::optional<Device> device, int64_t BLOCK_SIZE) {
    fx::MaskMod mm = as_mask_mod(mask_mod);
    fx::BlockMask bm;
    {
      nb::gil_scoped_release release;
      bm = fx::create_block_mask(mm, B.value_or(1), H.value_or(1), Q_LEN, KV_LEN, BLOCK_SIZE);
    }
    if (device && device->is_cuda()) {
      for (Tensor* t : {&bm.kv_num_blocks, &bm.kv_indices, &bm.full_kv_num_blocks, &bm.full_kv_indices,
                        &bm.q_num_blocks, &bm.q_indices, &bm.full_q_num_blocks, &bm.full_q_indices})
        if (t->defined()) *t = t->to(*device);
    }
    return bm;
  }, "mask_mod"_a, "B"_a, "H"_a, "Q_LEN"_a, "KV_LEN"_a, "device"_a = "cpu", "BLOCK_SIZE"_a = 128,
  "Classifies every (q-block, kv-block) as empty / partial / full from the mask's IR. B, H: None broadcasts.");

  m.def("flex_attention", [](const Tensor& q, const Tensor& k, const Tensor& v, nb::handle score_mod,
                             const fx::BlockMask* block_mask, std::optional<double> scale, bool enable_gqa,
                             bool return_lse) -> nb::object {
    fx::FlexOptions o;
    o.score_mod = as_score_mod(score_mod);
    o.block_mask = block_mask;
    o.scale = scale.value_or(0.0);
    o.enable_gqa = enable_gqa;
    o.return_lse = return_lse;
    fx::FlexOutput r;
    {
      nb::gil_scoped_release release;
      r = fx::flex_attention(q, k, v, o);
    }
    if (return_lse) return nb::make_tuple(r.out, r.lse);
    return nb::cast(r.out);
  }, "query"_a, "key"_a, "value"_a, "score_mod"_a = nb::none(), "block_mask"_a = nb::none(), "scale"_a = nb::none(),
  "enable_gqa"_a = false, "return_lse"_a = false,
  "query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] -> out [B, Hq, L, Ev] (+ lse [B, Hq, L] fp32)");
}

}  // namespace kiln::py
