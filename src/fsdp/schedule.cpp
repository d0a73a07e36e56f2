// The FSDP schedule: gathers (flat all_gather_single per unit, copied out into the unsharded
// buffer), the two autograd nodes around a unit (re-gather before its backward; reduce-scatter of
// its gradients after), prefetching the neighbour's gather, and the final wait for the gradients.
#include "fsdp/fsdp_state.h"

#include "kiln/autograd.h"

namespace kiln::dist::detail {

namespace {

// The unit gathered next in forward order (after u), or null.
FsdpUnit* next_in_forward(FsdpGroup& g, const FsdpUnit& u) {
  const size_t i = g.index_of(&u);
  return i + 1 < g.units.size() ? g.units[i + 1] : nullptr;
}

// The unit whose backward runs after u's: the one before it in forward order; from the root, the last.
FsdpUnit* next_in_backward(FsdpGroup& g, const FsdpUnit& u) {
  const size_t i = g.index_of(&u);
  if (i == 0) return g.units.size() > 1 ? g.units.back() : nullptr;
  return i > 1 ? g.units[i - 1] : nullptr;
}

void prefetch(FsdpUnit* u) {
  if (u != nullptr && !u->unsharded && !u->gather_work) start_gather(*u);
}

// Starts the reduce-scatter of the unit's full gradients (one per parameter, whole shape).
void start_reduce(FsdpGroup& g, FsdpUnit& u, const std::vector<Tensor>& grads) {
  NoGradGuard no_grad;
  const int world = g.world();
  Tensor in = zeros({world * u.shard_numel}, TensorOptions().dtype(u.reduce_dtype).device(u.device));
  for (size_t i = 0; i < u.params.size(); ++i) {
    const ShardedParam& p = u.params[i];
    if (!grads[i].defined()) continue;
    Tensor flat = grads[i].contiguous().reshape({-1});
    for (int r = 0; r < world; ++r) {
      const int64_t n = p.valid_rows(r) * p.row_numel;
      if (n == 0) continue;
      in.narrow(0, r * u.shard_numel + p.shard_offset, n).copy_(flat.narrow(0, r * p.shard_rows * p.row_numel, n));
    }
  }
  Tensor out = empty({u.shard_numel}, TensorOptions().dtype(u.reduce_dtype).device(u.device));
  auto work = g.rs_comm->reduce_scatter_single(out, in, u.options.reduce_op, /*async_op=*/true);
  g.pending.push_back({&u, in, out, work});
}

}  // namespace

void start_gather(FsdpUnit& u) {
  if (u.shard_numel == 0 || u.gather_work) return;
  NoGradGuard no_grad;
  FsdpGroup& g = *u.group;
  const TensorOptions opts = TensorOptions().dtype(u.param_dtype).device(u.device);
  u.gather_in = empty({u.shard_numel}, opts);
  for (const ShardedParam& p : u.params)
    u.gather_in.narrow(0, p.shard_offset, p.shard_numel()).copy_(p.shard.detach().reshape({-1}));
  u.gather_out = empty({g.world() * u.shard_numel}, opts);
  u.gather_work = g.ag_comm->all_gather_single(u.gather_out, u.gather_in, /*async_op=*/true);
}

void wait_gather(FsdpUnit& u) {
  if (u.unsharded || u.shard_numel == 0) {
    u.unsharded = true;
    return;
  }
  if (!u.gather_work) start_gather(u);
  u.gather_work->wait();
  NoGradGuard no_grad;
  const int world = u.group->world();
  for (const ShardedParam& p : u.params) {
    for (int r = 0; r < world; ++r) {
      const int64_t n = p.valid_rows(r) * p.row_numel;
      if (n == 0) continue;
      u.buffer->view(p.full_offset + r * p.shard_rows * p.row_numel, {n}, u.param_dtype)
          .copy_(u.gather_out.narrow(0, r * u.shard_numel + p.shard_offset, n));
    }
  }
  u.gather_work.reset();
  u.gather_in = Tensor();
  u.gather_out = Tensor();
  u.unsharded = true;
}

void bind_unsharded(FsdpUnit& u) {
  std::shared_ptr<FsdpGroup> g = u.group;
  std::vector<Tensor> full, shards;
  for (const ShardedParam& p : u.params) {
    full.push_back(u.buffer->view(p.full_offset, p.shape, u.param_dtype));
    shards.push_back(p.shard);
  }
  if (autograd::needs_grad(shards)) {
    FsdpUnit* unit = &u;
    // Runs once every op that used the unsharded parameters has run its backward.
    autograd::record("fsdp_reduce_scatter", full, shards, [g, unit](const std::vector<Tensor>& grads) {
      start_reduce(*g, *unit, grads);
      if (!unit->is_root()) bind_sharded(*unit);
      return std::vector<Tensor>(grads.size());
    });
  }
  for (size_t i = 0; i < u.params.size(); ++i)
    for (Tensor* slot : u.params[i].slots) *slot = full[i];
}

void bind_sharded(FsdpUnit& u) {
  for (ShardedParam& p : u.params)
    for (Tensor* slot : p.slots) *slot = p.shard;
  if (u.unsharded && u.buffer) u.buffer->release();
  u.unsharded = false;
}

std::vector<Tensor> run_forward(FsdpUnit& u, const std::function<std::vector<Tensor>()>& fn) {
  std::shared_ptr<FsdpGroup> g = u.group;
  wait_gather(u);
  bind_unsharded(u);
  prefetch(next_in_forward(*g, u));
  std::vector<Tensor> ys = fn();
  if (!u.is_root() && u.options.reshard_after_forward) bind_sharded(u);
  std::vector<size_t> with_grad;  // the outputs a backward will reach
  for (size_t i = 0; i < ys.size(); ++i)
    if (ys[i].defined() && autograd::needs_grad({ys[i]})) with_grad.push_back(i);
  if (with_grad.empty()) {
    if (u.is_root())  // no backward follows: every unit goes back to its shards
      for (FsdpUnit* unit : g->units) bind_sharded(*unit);
    return ys;
  }
  std::vector<Tensor> grad_ys, outs;
  for (size_t i : with_grad) grad_ys.push_back(ys[i]), outs.push_back(ys[i].detach());
  FsdpUnit* unit = &u;
  // The unit's outputs: their backward runs before any of the unit's ops, so the parameters are
  // back in the buffer (same address) when they need them.
  autograd::record("fsdp_pre_backward", outs, grad_ys, [g, unit](const std::vector<Tensor>& grads) {
    wait_gather(*unit);
    prefetch(next_in_backward(*g, *unit));
    return grads;
  });
  for (size_t k = 0; k < with_grad.size(); ++k) ys[with_grad[k]] = outs[k];
  return ys;
}

Tensor run_forward(FsdpUnit& u, const std::function<Tensor()>& fn) {
  return run_forward(u, std::function<std::vector<Tensor>()>([&] { return std::vector<Tensor>{fn()}; }))[0];
}

void finish_grad_sync(FsdpGroup& g) {
  NoGradGuard no_grad;
  for (PendingReduce& pr : g.pending) {
    pr.work->wait();
    FsdpUnit& u = *pr.unit;
    if (u.options.gradient_scale != 1.0) pr.output = mul(pr.output, u.options.gradient_scale);
    for (ShardedParam& p : u.params) {
      Tensor grad = pr.output.narrow(0, p.shard_offset, p.shard_numel()).view(p.shard_shape());
      if (grad.dtype() != p.shard.dtype()) grad = grad.to(p.shard.dtype());
      if (p.shard.grad().defined()) p.shard.set_grad(add(p.shard.grad(), grad));
      else p.shard.set_grad(grad);
    }
  }
  g.pending.clear();
  for (FsdpUnit* u : g.units) {
    if (u->gather_work) wait_gather(*u);  // a prefetch nobody consumed: keep the comm in order
    bind_sharded(*u);
  }
}

}  // namespace kiln::dist::detail
