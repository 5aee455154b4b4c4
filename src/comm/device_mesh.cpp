// DeviceMesh construction: node-local shard groups or an explicit shard size
// (see fsdp/comm/device_mesh.hpp).
#include "fsdp/comm/device_mesh.hpp"

#include <sstream>

#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

DeviceMesh DeviceMesh::create(MPI_Comm world, int64_t shard_size) {
  DeviceMesh mesh;
  int rank = 0, size = 1;
  FSDP_CHECK_MPI(MPI_Comm_rank(world, &rank));
  FSDP_CHECK_MPI(MPI_Comm_size(world, &size));

  MPI_Comm node = MPI_COMM_NULL;
  FSDP_CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  FSDP_CHECK_MPI(MPI_Comm_rank(node, &mesh.local_rank_));
  FSDP_CHECK_MPI(MPI_Comm_size(node, &mesh.local_size_));

  int shard_color = 0, shard_key = rank;
  if (shard_size > 0) {
    if (size % shard_size != 0) {
      MPI_Comm_free(&node);
      std::ostringstream os;
      os << "mesh.shard_size: " << shard_size << " does not divide the world size " << size;
      throw InputError(os.str());
    }
    shard_color = static_cast<int>(rank / shard_size);
  } else {
    // Shard group = this node. Its colour is the world rank of the node's first rank.
    int leader = rank;
    FSDP_CHECK_MPI(MPI_Bcast(&leader, 1, MPI_INT, 0, node));
    shard_color = leader;
    int min_local = mesh.local_size_, max_local = mesh.local_size_;
    FSDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &min_local, 1, MPI_INT, MPI_MIN, world));
    FSDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &max_local, 1, MPI_INT, MPI_MAX, world));
    if (min_local != max_local) {
      MPI_Comm_free(&node);
      std::ostringstream os;
      os << "mesh.shard_size: nodes run unequal numbers of ranks (" << min_local << " to "
         << max_local << "); set mesh.shard_size explicitly";
      throw InputError(os.str());
    }
  }
  MPI_Comm shard = MPI_COMM_NULL, replicate = MPI_COMM_NULL;
  FSDP_CHECK_MPI(MPI_Comm_split(world, shard_color, shard_key, &shard));
  int shard_rank = 0;
  FSDP_CHECK_MPI(MPI_Comm_rank(shard, &shard_rank));
  FSDP_CHECK_MPI(MPI_Comm_split(world, shard_rank, rank, &replicate));

  mesh.world_ = std::make_unique<MpiCommunicator>(world);
  mesh.shard_ = std::make_unique<MpiCommunicator>(shard);
  mesh.replicate_ = std::make_unique<MpiCommunicator>(replicate);
  mesh.self_ = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
  MPI_Comm_free(&shard);
  MPI_Comm_free(&replicate);
  MPI_Comm_free(&node);
  return mesh;
}

std::string DeviceMesh::describe() const {
  std::ostringstream os;
  os << "world " << world_size() << " = replicate " << replicate_size() << " x shard "
     << shard_size();
  return os.str();
}

}  // namespace fsdp
