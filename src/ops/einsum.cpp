// einsum: parse the subscripts, take diagonals for repeated indices (a product with an identity
// mask and a sum), sum away indices nothing else needs, then contract operands left to right, each
// pair as one batched matmul over [batch, kept-left, contracted] x [batch, contracted, kept-right].
// Everything is built from differentiable ops, so gradients come for free.
#include <algorithm>
#include <map>
#include <string>

#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace kiln {
namespace {

constexpr const char* kOp = "einsum";
constexpr int kEllipsisBase = 1000;  // label of ellipsis dim j (counted from the right): 1000 + j

struct Operand {
  Tensor t;
  std::vector<int> labels;  // one per dim of t
};

std::string label_name(int l) {
  if (l >= kEllipsisBase) return "...";
  return std::string(1, static_cast<char>(l));
}

// Letters and "..." -> labels; the ellipsis becomes `ellipsis_dims` labels (-1: not present).
std::vector<int> parse_term(const std::string& s, int64_t ellipsis_dims, bool* has_ellipsis, int64_t* letters) {
  std::vector<int> out;
  *has_ellipsis = false;
  *letters = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.') {
      KILN_CHECK(s.compare(i, 3, "...") == 0 && !*has_ellipsis, kOp,
                 "found '.' that is not part of a single ellipsis in \"", s, "\"");
      *has_ellipsis = true;
      for (int64_t j = ellipsis_dims - 1; j >= 0; --j) out.push_back(kEllipsisBase + static_cast<int>(j));
      i += 2;
    } else {
      KILN_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'), kOp,
                 "subscripts must be letters in [a-zA-Z], got '", c, "'");
      out.push_back(c);
      ++*letters;
    }
  }
  return out;
}

int64_t position(const std::vector<int>& labels, int l) {
  const auto it = std::find(labels.begin(), labels.end(), l);
  return it == labels.end() ? -1 : it - labels.begin();
}

// Folds every repeated label of `op` into one dim (the diagonal).
void take_diagonals(Operand& op) {
  for (size_t i = 0; i < op.labels.size(); ++i) {
    for (size_t j = i + 1; j < op.labels.size();) {
      if (op.labels[j] != op.labels[i]) {
        ++j;
        continue;
      }
      const int64_t n = op.t.size(static_cast<int64_t>(i));
      KILN_CHECK(op.t.size(static_cast<int64_t>(j)) == n, kOp, "subscript '", label_name(op.labels[i]),
                 "' is repeated for an operand but the sizes don't match, ", n, " != ", op.t.size(static_cast<int64_t>(j)));
      const TensorOptions io = TensorOptions(kInt64).device(op.t.device());
      const Tensor eye = eq(arange(static_cast<double>(n), io).unsqueeze(1), arange(static_cast<double>(n), io).unsqueeze(0));
      Shape shape(op.labels.size(), 1);
      shape[i] = n;
      shape[j] = n;
      op.t = sum(op.t * eye.to(op.t.dtype()).reshape(shape), {static_cast<int64_t>(j)});
      op.labels.erase(op.labels.begin() + static_cast<std::ptrdiff_t>(j));
    }
  }
}

// Sums away the labels of `op` that `keep` does not hold.
void sum_unneeded(Operand& op, const std::vector<int>& keep) {
  std::vector<int64_t> dims;
  std::vector<int> left;
  for (size_t i = 0; i < op.labels.size(); ++i) {
    if (position(keep, op.labels[i]) < 0) dims.push_back(static_cast<int64_t>(i));
    else left.push_back(op.labels[i]);
  }
  if (dims.empty()) return;
  op.t = sum(op.t, dims);
  op.labels = left;
}

Operand contract(Operand a, Operand b, const std::vector<int>& keep) {
  std::vector<int> both_labels = keep;
  for (int l : b.labels) both_labels.push_back(l);
  sum_unneeded(a, both_labels);
  std::vector<int> a_keep = keep;
  for (int l : a.labels) a_keep.push_back(l);
  sum_unneeded(b, a_keep);
  std::vector<int> batch, contracted, left, right;
  for (int l : a.labels) {
    if (position(b.labels, l) < 0) left.push_back(l);
    else if (position(keep, l) >= 0) batch.push_back(l);
    else contracted.push_back(l);
  }
  for (int l : b.labels)
    if (position(a.labels, l) < 0) right.push_back(l);
  // Shared labels broadcast (size 1 against n), as torch does.
  Shape a_shape = a.t.sizes(), b_shape = b.t.sizes();
  std::map<int, int64_t> size;
  for (size_t i = 0; i < a.labels.size(); ++i) size[a.labels[i]] = a_shape[i];
  for (size_t i = 0; i < b.labels.size(); ++i) {
    const int l = b.labels[i];
    const int64_t sb = b_shape[i];
    if (!size.count(l)) {
      size[l] = sb;
      continue;
    }
    const int64_t sa = size[l];
    KILN_CHECK(sa == sb || sa == 1 || sb == 1, kOp, "operands do not broadcast: subscript '", label_name(l),
               "' has size ", sa, " in one operand and ", sb, " in another");
    size[l] = std::max(sa, sb);
  }
  for (size_t i = 0; i < a.labels.size(); ++i) a_shape[i] = size[a.labels[i]];
  for (size_t i = 0; i < b.labels.size(); ++i) b_shape[i] = size[b.labels[i]];
  Shape pa, pb;
  int64_t nb = 1, m = 1, k = 1, n = 1;
  for (int l : batch) pa.push_back(position(a.labels, l)), pb.push_back(position(b.labels, l)), nb *= size[l];
  for (int l : left) pa.push_back(position(a.labels, l)), m *= size[l];
  for (int l : contracted) pa.push_back(position(a.labels, l)), pb.push_back(position(b.labels, l)), k *= size[l];
  for (int l : right) pb.push_back(position(b.labels, l)), n *= size[l];
  // Integer operands contract in float64 (exact below 2^53) and come back in their dtype.
  const DType dt = promote_types(a.t.dtype(), b.t.dtype());
  const DType mm_dt = is_floating_point(dt) ? dt : kFloat64;
  const Tensor a3 = a.t.to(mm_dt).expand(a_shape).permute(pa).reshape({nb, m, k});
  const Tensor b3 = b.t.to(mm_dt).expand(b_shape).permute(pb).reshape({nb, k, n});
  Operand out;
  Shape out_shape;
  for (const auto* group : {&batch, &left, &right})
    for (int l : *group) out.labels.push_back(l), out_shape.push_back(size[l]);
  out.t = matmul(a3, b3).reshape(out_shape);
  if (mm_dt != dt) out.t = out.t.to(dt);
  return out;
}

}  // namespace

Tensor einsum(const std::string& equation_in, const std::vector<Tensor>& operands) {
  std::string equation;
  for (char c : equation_in)
    if (c != ' ') equation.push_back(c);
  const size_t arrow = equation.find("->");
  const std::string lhs = equation.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  KILN_CHECK(terms.size() == operands.size(), kOp, "the equation has ", terms.size(), " operand(s) but ",
             operands.size(), " tensor(s) were given");
  KILN_CHECK(!operands.empty(), kOp, "must be given at least one operand");
  std::vector<Operand> ops;
  int64_t max_ellipsis = 0;
  std::map<int, int> count;
  for (size_t i = 0; i < terms.size(); ++i) {
    KILN_CHECK(operands[i].defined(), kOp, "operand ", i, " is undefined");
    bool has_ellipsis = false;
    int64_t letters = 0;
    parse_term(terms[i], 0, &has_ellipsis, &letters);
    const int64_t rank = operands[i].dim();
    const int64_t ell = has_ellipsis ? rank - letters : 0;
    KILN_CHECK(has_ellipsis ? ell >= 0 : letters == rank, kOp, "the number of subscripts in the equation (", letters,
               ") does not match the number of dimensions (", rank, ") for operand ", i,
               has_ellipsis ? "" : " and no ellipsis was given");
    max_ellipsis = std::max(max_ellipsis, ell);
    Operand op{operands[i], parse_term(terms[i], ell, &has_ellipsis, &letters)};
    for (int l : op.labels) ++count[l];
    ops.push_back(op);
  }
  std::vector<int> output;
  if (arrow != std::string::npos) {
    bool has_ellipsis = false;
    int64_t letters = 0;
    output = parse_term(equation.substr(arrow + 2), max_ellipsis, &has_ellipsis, &letters);
    for (size_t i = 0; i < output.size(); ++i) {
      const std::string name = label_name(output[i]);
      KILN_CHECK(count.count(output[i]), kOp, "output subscript '", name,
                 "' does not appear in the equation for any input operand");
      KILN_CHECK(position(output, output[i]) == static_cast<int64_t>(i), kOp, "output subscript '", name,
                 "' appears more than once in the output");
    }
  } else {
    for (int64_t j = max_ellipsis - 1; j >= 0; --j) output.push_back(kEllipsisBase + static_cast<int>(j));
    for (const auto& [l, c] : count)
      if (c == 1 && l < kEllipsisBase) output.push_back(l);
  }
  for (Operand& op : ops) take_diagonals(op);
  // Labels needed after operand i: the output's and those of every later operand.
  auto needed_after = [&](size_t i) {
    std::vector<int> keep = output;
    for (size_t j = i + 1; j < ops.size(); ++j) keep.insert(keep.end(), ops[j].labels.begin(), ops[j].labels.end());
    return keep;
  };
  Operand cur = ops[0];
  sum_unneeded(cur, needed_after(0));
  for (size_t i = 1; i < ops.size(); ++i) cur = contract(cur, ops[i], needed_after(i));
  sum_unneeded(cur, output);
  Shape perm;
  for (int l : output) {
    const int64_t p = position(cur.labels, l);
    KILN_CHECK(p >= 0, kOp, "internal error: output subscript '", label_name(l), "' was lost");
    perm.push_back(p);
  }
  return perm.empty() ? cur.t : cur.t.permute(perm);
}

}  // namespace kiln
