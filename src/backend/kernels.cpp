// The Kernels defaults that are not pairs of other calls (see fsdp/backend/kernels.hpp).
#include "fsdp/backend/kernels.hpp"

#include <utility>

namespace fsdp {

namespace {

// The CPU twin of a captured graph: the captured calls, called again.
class CallGraph final : public KernelGraph {
 public:
  explicit CallGraph(std::function<void()> calls) : calls_(std::move(calls)) {}
  void launch() override { calls_(); }

 private:
  std::function<void()> calls_;
};

}  // namespace

std::unique_ptr<KernelGraph> Kernels::capture_graph(std::function<void()> enqueue) {
  return std::make_unique<CallGraph>(std::move(enqueue));
}

}  // namespace fsdp
