#pragma once
// kiln::dist::fully_shard: FSDP2-style sharded data parallelism over a kiln::dist communicator.
//
//   for (auto& block : blocks) kiln::dist::fully_shard(*block, comm);   // forward order
//   auto root = kiln::dist::fully_shard(model, comm);                    // the rest; last
//   root->set_separate_reduce_scatter_group(rs_comm);                   // optional: overlap
//   AdamW opt(model.parameters());          // the shards: model.parameters() between steps
//   // in the model's forward: fsdp_forward(*block, [&] { return block->forward(x); }) per block,
//   // and the whole forward inside fsdp_forward(model, ...) (or root->forward(...)).
//   loss.backward();  root->finish_grad_sync();  opt.step();
//
// Each parameter is split on dim 0 into world_size equal row blocks (the last padded with zero
// rows); a rank keeps its block as a leaf the optimizer steps on. kiln has no module hooks, so
// each sharded module's forward runs through FSDPModule::forward(fn): before fn the module's
// parameters are all-gathered (one flat all_gather_single per module, the next module's gather
// prefetched as an async Work) and bound to the module's parameter slots; after fn they are
// resharded (reshard_after_forward: the unsharded memory is returned to the OS while its address
// stays valid for the saved tensors of backward). Two autograd nodes bracket the module in the
// graph: one on its output re-gathers the parameters before the module's backward ops run (and
// prefetches the previous module's gather); one on the gathered parameters receives their full
// gradients, starts an async reduce_scatter_single of them and returns none, so the engine's
// newest-first order interleaves the gathers and the reduce-scatters with backward compute.
// finish_grad_sync() waits for the reduce-scatters and sets the shards' .grad.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dist.h"
#include "kiln/io.h"
#include "kiln/nn.h"
#include "kiln/tensor.h"

namespace kiln::dist {

// FSDP2's MixedPrecisionPolicy: the dtype parameters are gathered and computed in, and the dtype
// gradients are reduced in; unset keeps the parameters' dtype. Shards stay in their own dtype.
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;   // e.g. kBFloat16
  std::optional<DType> reduce_dtype;  // e.g. kFloat32
};

struct FullyShardOptions {
  bool reshard_after_forward = true;  // the root module never reshards after forward
  MixedPrecisionPolicy mp_policy;
  // AVG: each rank's gradient is of its mean loss, so the average is the global-batch gradient.
  // SUM then multiplied by gradient_scale for other loss normalisations.
  ReduceOp reduce_op = ReduceOp::AVG;
  double gradient_scale = 1.0;
};

// One tensor split on dim 0 as fully_shard splits parameters: shard [ceil(rows / world), ...] holds
// rows [rank * that, ...) of full_shape, padded with zero rows.
struct ShardSpec {
  std::string name;
  Shape full_shape;
  Tensor shard;
};

namespace detail {
struct FsdpGroup;
struct FsdpUnit;
}  // namespace detail

class FSDPModule {
 public:
  explicit FSDPModule(std::shared_ptr<detail::FsdpUnit> unit);
  ~FSDPModule();

  // Runs the module's forward `fn` between the gather and the reshard (see the header comment).
  Tensor forward(const std::function<Tensor()>& fn);
  // Explicit control (FSDP2's unshard / reshard): gathers the parameters into the module's slots;
  // async_op returns after starting the gather (the next forward or unshard waits for it).
  void unshard(bool async_op = false);
  void reshard();
  // Root only: waits for every reduce-scatter of the backward just run and sets (or accumulates
  // into) the shards' gradients; then reshards every module. Idempotent.
  void finish_grad_sync();
  // The group's reduce-scatters run on `comm` (same ranks, another communicator) so they overlap
  // the all-gathers.
  void set_separate_reduce_scatter_group(std::shared_ptr<Communicator> comm);

  // This rank's shards, in the module's named_parameters() order (padded: [ceil(dim0 / world), ...]).
  std::vector<std::pair<std::string, Tensor>> sharded_parameters() const;
  // Whole parameters (the padding dropped), gathered from every rank: called on every rank of the
  // group; names as the root module's named_parameters().
  std::vector<std::pair<std::string, Tensor>> full_parameters() const;
  // Every parameter of the group this rank holds, named from the root module (a root's view: all
  // units; else this unit's), for sharded checkpoints.
  std::vector<ShardSpec> shard_specs() const;
  std::shared_ptr<Communicator> comm() const;
  bool is_root() const;

 private:
  std::shared_ptr<detail::FsdpUnit> unit_;  // also owned by the module (a child "fsdp")
};

// Shards `module`'s parameters not already sharded by an earlier fully_shard call on one of its
// descendants (the state lives in a parameter-free child module named "fsdp", so it dies with the
// module); the last call (on the module that contains the others) makes the root. Called on
// every rank with the same module structure (checked: a kiln::Error on every rank otherwise).
// Parameters: one device (the communicator's), floating point, every rank's values the same.
std::shared_ptr<FSDPModule> fully_shard(nn::Module& module, std::shared_ptr<Communicator> comm,
                                        const FullyShardOptions& options = {});
// The FSDPModule fully_shard made for `module` (nullptr when it was not sharded).
std::shared_ptr<FSDPModule> fsdp_module(const nn::Module& module);

// ---- sharded checkpoints ----

// Called on every rank: each writes <dir>/shard-<rank>-of-<world>.safetensors (its real rows of
// every tensor, padding dropped, with checksums; atomic), then after a barrier rank 0 writes
// <dir>/index.json (atomic). A folder without its index is not a checkpoint.
void save_sharded(const std::string& dir, const std::vector<ShardSpec>& tensors, Communicator& comm,
                  const io::Metadata& metadata = {});
// Fills each spec's shard (shapes for comm's world size, which may differ from the writer's) from
// the checkpoint; a missing shard file or tensor, or a shape that differs, is a kiln::Error.
void load_sharded(const std::string& dir, const std::vector<ShardSpec>& into, Communicator& comm);
// The whole tensors of a sharded checkpoint (for an unsharded model); no communicator needed.
io::TensorDict load_sharded_full(const std::string& dir);
io::Metadata sharded_metadata(const std::string& dir);

// Runs fn through the module's FSDPModule::forward when it was sharded, else fn itself.
Tensor fsdp_forward(const nn::Module& module, const std::function<Tensor()>& fn);
// The same for a forward with several outputs (a block that hands its residual stream and its
// last branch, not yet added, to the next block's fused add + norm); undefined outputs and
// outputs without a gradient pass through.
std::vector<Tensor> fsdp_forward_outputs(const nn::Module& module, const std::function<std::vector<Tensor>()>& fn);

// clip_grad_norm_ over sharded gradients: the global L2 norm from an all_reduce of the ranks'
// squared sums; every rank scales its shards by the same factor. -> total norm [] float32.
Tensor clip_grad_norm_sharded_(const std::vector<Tensor>& shards, double max_norm, Communicator& comm);

}  // namespace kiln::dist
