// fsdp/comm/device_mesh.hpp: the 2-D process mesh, world = replicate x shard
// (torch.distributed.device_mesh.DeviceMesh with mesh_dim_names ("replicate", "shard"),
// as HYBRID_SHARD uses it).
//
// The shard group is the ranks of one node (Communicator::split_node(), i.e.
// MPI_COMM_TYPE_SHARED), unless `shard_size` > 0 overrides it: then shard group g = world
// ranks [g * shard_size, (g+1) * shard_size), which emulates several nodes on one machine.
// The replicate group of a rank is the ranks with the same shard-group rank in every group.
// Every group is a new communicator split from the one passed to create(), so the mesh
// works with any Communicator implementation (MPI today, NCCL later).
//
// create() moves a few host values through `world` (the node leader, the node sizes), so it
// needs a host-memory communicator; a device mesh (NCCL, or MPI staged through pinned host
// memory) is then made from the host one with map(), which changes where buffers live and
// nothing else.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fsdp/comm/communicator.hpp"

namespace fsdp {

class DeviceMesh {
 public:
  // Collective over `world` (only split_node(), split() and collectives on it; `world` is
  // not kept: the mesh's world() is world.split(0, world.rank())). shard_size <= 0: shard
  // group = node. Throws InputError (key mesh.shard_size, exit code 2, on every rank) if
  // shard_size does not divide the world size, or if node-local groups have unequal sizes.
  static DeviceMesh create(Communicator& world, int64_t shard_size);

  // A mesh over the same ranks (same world/shard/replicate/self groups, same local rank and
  // local size) whose communicators are make(g) of this mesh's: e.g. an NCCL communicator
  // bootstrapped over the host group g. Collective over world(): make is called on every
  // rank in the same order (world, shard group, replicate group, self), and may keep a
  // duplicate of g but not g itself (this mesh still owns it). Throws fsdp::Error if make
  // returns nullptr or a communicator whose rank or size differs from g's.
  using MakeCommunicator = std::function<std::unique_ptr<Communicator>(Communicator& group)>;
  DeviceMesh map(const MakeCommunicator& make) const;

  int world_rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int shard_rank() const { return shard_->rank(); }   // index within the shard group
  int shard_size() const { return shard_->size(); }
  int replicate_rank() const { return replicate_->rank(); }  // which shard group
  int replicate_size() const { return replicate_->size(); }
  int local_rank() const { return local_rank_; }      // rank among this node's ranks
  int local_size() const { return local_size_; }      // ranks on this node
  int node_leader() const { return node_leader_; }    // world rank of this node's local rank 0

  Communicator& world() const { return *world_; }
  Communicator& shard_group() const { return *shard_; }
  Communicator& replicate_group() const { return *replicate_; }
  Communicator& self() const { return *self_; }        // a group of one

  std::string describe() const;  // "world 4 = replicate 2 x shard 2"

 private:
  DeviceMesh() = default;
  std::unique_ptr<Communicator> world_, shard_, replicate_, self_;
  int local_rank_ = 0, local_size_ = 1, node_leader_ = 0;
};

}  // namespace fsdp
