#pragma once
// Internal state of fully_shard: a group (the modules sharded under one root, in forward order)
// of units (one sharded module each: its parameters' layout, shards, unsharded buffer, pending
// gather).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/fsdp.h"
#include "kiln/nn.h"

namespace kiln::dist::detail {

// Memory for a unit's unsharded parameters whose address outlives release(): the saved tensors of
// backward keep pointing at it while the parameters are resharded. On the CPU release() hands the
// pages back to the OS (madvise); on CUDA the memory is kept.
class UnshardedBuffer {
 public:
  UnshardedBuffer(Device device, size_t nbytes);
  ~UnshardedBuffer();
  UnshardedBuffer(const UnshardedBuffer&) = delete;
  UnshardedBuffer& operator=(const UnshardedBuffer&) = delete;
  // A tensor over [offset, offset + numel) elements (a fresh storage: its version is its own).
  Tensor view(int64_t offset, const Shape& shape, DType dtype) const;
  void release();

 private:
  Device device_;
  size_t nbytes_ = 0;
  void* data_ = nullptr;
  bool mapped_ = false;
};

struct ShardedParam {
  std::string name;            // relative to the unit's module
  std::vector<Tensor*> slots;  // every registry slot holding it (weight tying)
  Shape shape;                 // whole parameter
  int64_t rows = 1, row_numel = 1, shard_rows = 1;
  int64_t shard_offset = 0;    // in the flat shard
  int64_t full_offset = 0;     // in the unsharded buffer
  Tensor shard;                // leaf [shard_rows, shape[1:]...], padding rows zero
  int64_t shard_numel() const { return shard_rows * row_numel; }
  Shape shard_shape() const;
  // Rows of rank r's block that are real (not padding).
  int64_t valid_rows(int r) const;
};

struct FsdpGroup;

struct FsdpUnit {
  nn::Module* module = nullptr;
  FullyShardOptions options;
  uint64_t serial = 0;      // fully_shard call order
  std::string prefix;       // dotted path from the root module ("" for the root)
  std::shared_ptr<FsdpGroup> group;  // replaced when a containing module is sharded
  std::vector<ShardedParam> params;
  int64_t shard_numel = 0, full_numel = 0;
  DType param_dtype = kFloat32, reduce_dtype = kFloat32;
  Device device = kCPU;
  std::unique_ptr<UnshardedBuffer> buffer;
  bool unsharded = false;   // the buffer holds the gathered parameters
  Tensor gather_in, gather_out;
  std::shared_ptr<Work> gather_work;
  bool is_root() const;
};

struct PendingReduce {
  FsdpUnit* unit;
  Tensor input, output;
  std::shared_ptr<Work> work;
};

struct FsdpGroup {
  std::shared_ptr<Communicator> ag_comm, rs_comm;
  std::vector<FsdpUnit*> units;  // forward order: root first (each owned by its module)
  std::vector<PendingReduce> pending;
  int world() const { return ag_comm->get_size(); }
  int rank() const { return ag_comm->get_rank(); }
  size_t index_of(const FsdpUnit* u) const;
};

// schedule.cpp
void start_gather(FsdpUnit& u);
void wait_gather(FsdpUnit& u);        // starts it first when none is pending
void bind_unsharded(FsdpUnit& u);
void bind_sharded(FsdpUnit& u);        // the slots get the shards; the buffer is released
void finish_grad_sync(FsdpGroup& g);
Tensor run_forward(FsdpUnit& u, const std::function<Tensor()>& fn);
std::vector<Tensor> run_forward(FsdpUnit& u, const std::function<std::vector<Tensor>()>& fn);

// The module that carries a unit in the module tree (a child named "fsdp").
class FsdpStateModule : public nn::Module {
 public:
  explicit FsdpStateModule(std::shared_ptr<FsdpUnit> u) : unit(std::move(u)) {}
  std::string type_name() const override { return "FSDPState"; }
  std::shared_ptr<FsdpUnit> unit;
};

}  // namespace kiln::dist::detail
