// DeviceMesh construction: node-local shard groups or an explicit shard size, built from
// Communicator::split_node(), split() and collectives only (see fsdp/comm/device_mesh.hpp).
#include "fsdp/comm/device_mesh.hpp"

#include <cstdint>
#include <sstream>

#include "fsdp/core/error.hpp"

namespace fsdp {

DeviceMesh DeviceMesh::create(Communicator& world, int64_t shard_size) {
  DeviceMesh mesh;
  const int rank = world.rank(), size = world.size();

  std::unique_ptr<Communicator> node = world.split_node();
  mesh.local_rank_ = node->rank();
  mesh.local_size_ = node->size();
  int32_t leader = rank;  // the node's name: the world rank of its first rank
  node->broadcast(&leader, 1, DType::i32, 0)->wait();
  mesh.node_leader_ = leader;

  int shard_color = 0;
  if (shard_size > 0) {
    if (size % shard_size != 0) {
      std::ostringstream os;
      os << "mesh.shard_size: " << shard_size << " does not divide the world size " << size;
      throw InputError(os.str());
    }
    shard_color = static_cast<int>(rank / shard_size);
  } else {
    // Shard group = this node. Its colour is the world rank of the node's first rank.
    shard_color = leader;
    // {max local size, -min local size} in one all-reduce (ReduceOp has no min).
    int32_t extremes[2] = {mesh.local_size_, -mesh.local_size_};
    world.all_reduce(extremes, extremes, 2, DType::i32, ReduceOp::max)->wait();
    const int max_local = extremes[0], min_local = -extremes[1];
    if (min_local != max_local) {
      std::ostringstream os;
      os << "mesh.shard_size: nodes run unequal numbers of ranks (" << min_local << " to "
         << max_local << "); set mesh.shard_size explicitly";
      throw InputError(os.str());
    }
  }
  mesh.shard_ = world.split(shard_color, rank);
  mesh.replicate_ = world.split(mesh.shard_->rank(), rank);
  mesh.world_ = world.split(0, rank);
  mesh.self_ = world.split(rank, 0);
  return mesh;
}

DeviceMesh DeviceMesh::map(const MakeCommunicator& make) const {
  const char* names[] = {"world", "shard", "replicate", "self"};
  Communicator* from[] = {world_.get(), shard_.get(), replicate_.get(), self_.get()};
  std::unique_ptr<Communicator> to[4];
  for (int g = 0; g < 4; ++g) {
    to[g] = make(*from[g]);
    if (!to[g] || to[g]->rank() != from[g]->rank() || to[g]->size() != from[g]->size()) {
      std::ostringstream os;
      os << "DeviceMesh::map: the communicator made for the " << names[g] << " group ";
      if (!to[g]) {
        os << "is null";
      } else {
        os << "has rank " << to[g]->rank() << " of " << to[g]->size() << ", expected rank "
           << from[g]->rank() << " of " << from[g]->size();
      }
      throw Error(os.str());
    }
  }
  DeviceMesh mesh;
  mesh.world_ = std::move(to[0]);
  mesh.shard_ = std::move(to[1]);
  mesh.replicate_ = std::move(to[2]);
  mesh.self_ = std::move(to[3]);
  mesh.local_rank_ = local_rank_;
  mesh.local_size_ = local_size_;
  mesh.node_leader_ = node_leader_;
  return mesh;
}

std::string DeviceMesh::describe() const {
  std::ostringstream os;
  os << "world " << world_size() << " = replicate " << replicate_size() << " x shard "
     << shard_size();
  return os.str();
}

}  // namespace fsdp
