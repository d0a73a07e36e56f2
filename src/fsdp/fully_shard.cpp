// fully_shard: the layout of a module's shards, the checks every rank runs together (one device,
// the same parameters on every rank), groups formed when a module containing sharded modules is
// sharded, and the FSDPModule handle.
#include <algorithm>
#include <functional>
#include <map>
#include <cmath>

#include "fsdp/fsdp_state.h"
#include "kiln/autograd.h"

namespace kiln::dist {

namespace detail {

Shape ShardedParam::shard_shape() const {
  Shape s = shape.empty() ? Shape{1} : shape;
  s[0] = shard_rows;
  return s;
}

int64_t ShardedParam::valid_rows(int r) const {
  return std::clamp<int64_t>(rows - r * shard_rows, 0, shard_rows);
}

bool FsdpUnit::is_root() const { return group != nullptr && group->units.front() == this; }

size_t FsdpGroup::index_of(const FsdpUnit* u) const {
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i] == u) return i;
  KILN_FAIL("fully_shard", "module not in its group");
}

namespace {

// The unit fully_shard attached to m (its child "fsdp"), or null.
std::shared_ptr<FsdpUnit> unit_of(const nn::Module& m) {
  for (auto& [name, child] : m.named_children())
    if (name == "fsdp")
      if (auto* sm = dynamic_cast<FsdpStateModule*>(child.get())) return sm->unit;
  return nullptr;
}

uint64_t g_serial = 0;

// Every (module, dotted path) under root, root first.
void walk(nn::Module& m, const std::string& prefix, std::vector<std::pair<nn::Module*, std::string>>& out) {
  out.emplace_back(&m, prefix);
  for (auto& [name, child] : m.named_children())
    if (!dynamic_cast<FsdpStateModule*>(child.get())) walk(*child, prefix.empty() ? name : prefix + "." + name, out);
}

// FNV-1a over the names, shapes and dtypes: equal on every rank when the modules agree.
uint64_t fingerprint(const std::vector<std::pair<std::string, Tensor>>& params) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  };
  for (const auto& [name, t] : params) {
    mix(name.data(), name.size());
    for (int64_t s : t.sizes()) mix(&s, sizeof s);
    const int d = static_cast<int>(t.dtype());
    mix(&d, sizeof d);
  }
  return h;
}

// One small all-gather, so every rank raises the same error: a parameter off the communicator's
// device on any rank, or ranks whose parameters differ.
void check_same_on_every_rank(Communicator& comm, const std::string& what,
                              const std::vector<std::pair<std::string, Tensor>>& params) {
  const int world = comm.get_size();
  const uint64_t h = fingerprint(params);
  std::string off_device;
  for (const auto& [name, t] : params)
    if (off_device.empty() && t.device() != comm.get_device())
      off_device = "'" + name + "' is on " + t.device().str() + ", the communicator on " + comm.get_device().str();
  Tensor mine = tensor({static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu),
                        static_cast<double>(params.size()), off_device.empty() ? 0.0 : 1.0},
                       TensorOptions().dtype(kFloat64).device(comm.get_device()));
  Tensor all = empty({4 * world}, mine.options());
  comm.all_gather_single(all, mine);
  const std::vector<double> v = all.cpu().to_vector();
  KILN_CHECK(off_device.empty(), "fully_shard", "parameters on different devices: ", off_device);
  for (int r = 0; r < world; ++r)
    KILN_CHECK(v[4 * r + 3] == 0, "fully_shard", "parameters on different devices on rank ", r);
  for (int r = 1; r < world; ++r) {
    KILN_CHECK(v[4 * r] == v[0] && v[4 * r + 1] == v[1] && v[4 * r + 2] == v[2], "fully_shard",
               "ranks disagree on the parameters of ", what, ": rank 0 has ", static_cast<int64_t>(v[2]),
               " parameters, rank ", r, " has ", static_cast<int64_t>(v[4 * r + 2]),
               " (names, shapes or dtypes differ)");
  }
}

std::shared_ptr<FsdpUnit> make_unit(nn::Module& module, Communicator& comm, const FullyShardOptions& options,
                                    const std::vector<const TensorImpl*>& taken) {
  auto u = std::make_shared<FsdpUnit>();
  u->module = &module;
  u->options = options;
  u->device = comm.get_device();
  std::vector<std::pair<nn::Module*, std::string>> mods;
  walk(module, "", mods);
  std::vector<std::pair<std::string, Tensor>> mine;
  for (const auto& [name, t] : module.named_parameters()) {
    if (!t.defined() || std::find(taken.begin(), taken.end(), t.impl()) != taken.end()) continue;
    mine.emplace_back(name, t);
  }
  check_same_on_every_rank(comm, module.type_name(), mine);
  const int world = comm.get_size(), rank = comm.get_rank();
  NoGradGuard no_grad;
  for (const auto& [name, t] : mine) {
    KILN_CHECK(is_floating_point(t.dtype()), "fully_shard", "parameter '", name, "' is not floating point");
    KILN_CHECK(u->params.empty() || t.dtype() == u->params.front().shard.dtype(), "fully_shard",
               "parameters of one module must share a dtype: '", name, "' is ", dtype_name(t.dtype()));
    ShardedParam p;
    p.name = name;
    p.shape = t.sizes();
    p.rows = p.shape.empty() ? 1 : p.shape[0];
    p.row_numel = p.rows == 0 ? 0 : t.numel() / p.rows;
    p.shard_rows = (p.rows + world - 1) / world;
    p.shard_offset = u->shard_numel;
    p.full_offset = u->full_numel;
    u->shard_numel += p.shard_numel();
    u->full_numel += t.numel();
    Tensor shard = zeros(p.shard_shape(), t.options());
    const int64_t valid = p.valid_rows(rank);
    const Tensor whole = p.shape.empty() ? t.reshape({1}) : t;
    if (valid > 0) shard.narrow(0, 0, valid).copy_(whole.narrow(0, rank * p.shard_rows, valid));
    p.shard = shard.requires_grad_(true);
    for (auto& [m, path] : mods)
      for (const auto& [pname, pt] : m->named_parameters(false))
        if (pt.defined() && pt.impl() == t.impl()) p.slots.push_back(&m->register_parameter(pname, pt));
    u->params.push_back(std::move(p));
  }
  const DType dtype = u->params.empty() ? kFloat32 : u->params.front().shard.dtype();
  u->param_dtype = options.mp_policy.param_dtype.value_or(dtype);
  u->reduce_dtype = options.mp_policy.reduce_dtype.value_or(u->param_dtype);
  u->buffer = std::make_unique<UnshardedBuffer>(u->device, u->full_numel * element_size(u->param_dtype));
  return u;
}

}  // namespace

std::shared_ptr<FSDPModule> make_fsdp(nn::Module& module, std::shared_ptr<Communicator> comm,
                                      const FullyShardOptions& options) {
  KILN_CHECK(comm != nullptr, "fully_shard", "no communicator");
  KILN_CHECK(unit_of(module) == nullptr, "fully_shard", "module ", module.type_name(), " is already sharded");
  std::vector<std::pair<nn::Module*, std::string>> mods;
  walk(module, "", mods);
  // Earlier fully_shard calls on descendants: their units join this module's group, this one the root.
  std::vector<std::pair<std::shared_ptr<FsdpUnit>, std::string>> children;
  std::vector<const TensorImpl*> taken;
  for (auto& [m, path] : mods) {
    auto cu = m == &module ? nullptr : unit_of(*m);
    if (!cu) continue;
    KILN_CHECK(cu->group->ag_comm == comm, "fully_shard", "module '", path, "' was sharded over another communicator");
    children.emplace_back(cu, path);
    for (const ShardedParam& p : cu->params) taken.push_back(p.shard.impl());
  }
  // A descendant's slots hold its shards now, so its parameters are not this module's own.
  auto unit = make_unit(module, *comm, options, taken);
  unit->serial = ++g_serial;
  auto group = std::make_shared<FsdpGroup>();
  group->ag_comm = comm;
  group->rs_comm = comm;
  std::sort(children.begin(), children.end(), [](auto& a, auto& b) { return a.first->serial < b.first->serial; });
  group->units.push_back(unit.get());
  for (auto& [cu, path] : children) {
    cu->prefix = path;
    group->units.push_back(cu.get());
  }
  for (FsdpUnit* u : group->units) {
    u->group = group;
    bind_sharded(*u);
  }
  module.register_module("fsdp", std::make_shared<FsdpStateModule>(unit));
  return std::make_shared<FSDPModule>(unit);
}

}  // namespace detail

using detail::FsdpGroup;
using detail::FsdpUnit;

FSDPModule::FSDPModule(std::shared_ptr<FsdpUnit> unit) : unit_(std::move(unit)) {}
FSDPModule::~FSDPModule() = default;

Tensor FSDPModule::forward(const std::function<Tensor()>& fn) { return detail::run_forward(*unit_, fn); }

void FSDPModule::unshard(bool async_op) {
  detail::start_gather(*unit_);
  if (async_op) return;
  detail::wait_gather(*unit_);
  for (auto& p : unit_->params)
    for (Tensor* slot : p.slots) *slot = unit_->buffer->view(p.full_offset, p.shape, unit_->param_dtype);
}

void FSDPModule::reshard() { detail::bind_sharded(*unit_); }
void FSDPModule::finish_grad_sync() { detail::finish_grad_sync(*unit_->group); }

void FSDPModule::set_separate_reduce_scatter_group(std::shared_ptr<Communicator> comm) {
  KILN_CHECK(comm && comm->get_size() == unit_->group->ag_comm->get_size() && comm->get_rank() == unit_->group->ag_comm->get_rank(),
             "set_separate_reduce_scatter_group", "the communicator must have the same ranks as the all-gather one");
  unit_->group->rs_comm = std::move(comm);
}

std::vector<std::pair<std::string, Tensor>> FSDPModule::sharded_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& p : unit_->params) out.emplace_back(p.name, p.shard);
  return out;
}

std::vector<std::pair<std::string, Tensor>> FSDPModule::full_parameters() const {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> by_name;
  const int world = unit_->group->world();
  for (FsdpUnit* u : unit_->group->units) {
    if (!is_root() && u != unit_.get()) continue;
    const std::string prefix = is_root() && !u->prefix.empty() ? u->prefix + "." : "";
    for (auto& p : u->params) {
      Tensor all = empty({world * p.shard_numel()}, p.shard.options());
      unit_->group->ag_comm->all_gather_single(all, p.shard.detach().contiguous().reshape({-1}));
      Tensor whole = empty(p.shape, p.shard.options());
      Tensor flat = whole.reshape({-1});
      for (int r = 0; r < world; ++r) {
        const int64_t n = p.valid_rows(r) * p.row_numel;
        if (n > 0) flat.narrow(0, r * p.shard_rows * p.row_numel, n).copy_(all.narrow(0, r * p.shard_numel(), n));
      }
      by_name[prefix + p.name] = whole;
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : unit_->module->named_parameters()) {
    auto it = by_name.find(name);
    if (it != by_name.end()) out.emplace_back(name, it->second);
  }
  return out;
}

std::shared_ptr<Communicator> FSDPModule::comm() const { return unit_->group->ag_comm; }
bool FSDPModule::is_root() const { return unit_->is_root(); }

std::shared_ptr<FSDPModule> fully_shard(nn::Module& module, std::shared_ptr<Communicator> comm,
                                        const FullyShardOptions& options) {
  return detail::make_fsdp(module, std::move(comm), options);
}

std::shared_ptr<FSDPModule> fsdp_module(const nn::Module& module) {
  auto unit = detail::unit_of(module);
  return unit ? std::make_shared<FSDPModule>(unit) : nullptr;
}

Tensor fsdp_forward(const nn::Module& module, const std::function<Tensor()>& fn) {
  auto unit = detail::unit_of(module);
  return unit ? detail::run_forward(*unit, fn) : fn();
}

std::vector<Tensor> fsdp_forward_outputs(const nn::Module& module, const std::function<std::vector<Tensor>()>& fn) {
  auto unit = detail::unit_of(module);
  return unit ? detail::run_forward(*unit, fn) : fn();
}

Tensor clip_grad_norm_sharded_(const std::vector<Tensor>& shards, double max_norm, Communicator& comm) {
  NoGradGuard no_grad;
  double sq = 0;
  for (const Tensor& s : shards) {
    if (!s.grad().defined()) continue;
    Tensor g = s.grad().to(kFloat64);
    sq += sum(mul(g, g)).item();
  }
  Tensor total = tensor({sq}, TensorOptions().dtype(kFloat64).device(comm.get_device()));
  comm.all_reduce(total, ReduceOp::SUM);
  const double norm = std::sqrt(total.cpu().item());
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1.0)
    for (const Tensor& s : shards)
      if (s.grad().defined()) s.set_grad(mul(s.grad(), scale));
  return tensor({norm}, TensorOptions().dtype(kFloat32).device(comm.get_device()));
}

}  // namespace kiln::dist
