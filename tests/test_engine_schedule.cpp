// The FSDP engine's communication schedule, observed exactly: a communicator of two ranks
// that records every collective (and every wait on one) drives a 3-block GPT-2's units
// through the ModuleHooks in the model's order, for each prefetch mode. Checks PyTorch
// FSDP's execution-order prefetch (the root prefetches the first block in forward and the
// last block in backward), that gradient reduce-scatters are issued per unit as its backward
// ends and waited only in end_step, and that nothing else is gathered. One process.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/gpt2.hpp"

namespace {

using Log = std::vector<std::string>;

class RecordingWork final : public fsdp::Work {
 public:
  RecordingWork(Log& log, std::string what) : log_(log), what_(std::move(what)) {}
  void wait() override {
    if (!waited_) log_.push_back("wait " + what_);
    waited_ = true;
  }
  std::shared_ptr<fsdp::Event> done() override { return std::make_shared<fsdp::HostEvent>(); }

 private:
  Log& log_;
  std::string what_;
  bool waited_ = false;
};

// Rank 0 of `size` ranks; moves no data, names each buffer by the unit it belongs to.
class RecordingCommunicator final : public fsdp::Communicator {
 public:
  RecordingCommunicator(int size, Log& log) : size_(size), log_(log) {}
  std::map<const void*, std::string> names;  // shard_param / shard_grad pointer -> unit name
  int rank() const override { return 0; }
  int size() const override { return size_; }
  fsdp::Device device() const override { return fsdp::Device::cpu; }
  fsdp::Stream& default_stream() override { return stream_; }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  std::unique_ptr<Communicator> split_node() override { return nullptr; }

 protected:
  std::unique_ptr<fsdp::Work> record(const std::string& what) {
    log_.push_back(what);
    return std::make_unique<RecordingWork>(log_, what);
  }
  std::unique_ptr<fsdp::Work> all_gather_impl(const void* send, void*, std::size_t, fsdp::DType,
                                              fsdp::Stream&) override {
    return record("AG " + name(send));
  }
  std::unique_ptr<fsdp::Work> reduce_scatter_impl(const void*, void* recv, std::size_t,
                                                  fsdp::DType, fsdp::ReduceOp op,
                                                  fsdp::Stream&) override {
    EXPECT_EQ(op, fsdp::ReduceOp::avg);
    return record("RS " + name(recv));
  }
  std::unique_ptr<fsdp::Work> all_reduce_impl(const void*, void* recv, std::size_t, fsdp::DType,
                                              fsdp::ReduceOp, fsdp::Stream&) override {
    return record("AR " + name(recv));
  }
  std::unique_ptr<fsdp::Work> broadcast_impl(void*, std::size_t, fsdp::DType, int,
                                             fsdp::Stream&) override {
    return record("BC");
  }

 private:
  std::string name(const void* p) const {
    auto it = names.find(p);
    return it == names.end() ? "?" : it->second;
  }
  int size_;
  Log& log_;
  fsdp::HostStream stream_;
};

// Runs one training step's hooks (modules in order, then in reverse) and returns the log,
// with "| fwd", "| bwd", "| end" markers between the phases, "Fm" before module m's
// pre_forward, "Bm" before its pre_backward and "/Bm" before its post_backward. Modules:
// 0 embeddings (root), 1-3 blocks h0-h2, 4 ln_f (root).
Log schedule(bool forward_prefetch, fsdp::BackwardPrefetch backward, int replicas = 1) {
  fsdp::Gpt2Config mc;
  mc.n_layer = 3;
  mc.n_head = 2;
  mc.n_embd = 8;
  mc.n_positions = 8;
  mc.vocab_size = 16;
  auto be = fsdp::make_cpu_backend(1);
  fsdp::Gpt2Model model(mc, *be);
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
  fc.sharding_strategy = replicas > 1 ? fsdp::ShardingStrategy::HYBRID_SHARD
                                      : fsdp::ShardingStrategy::FULL_SHARD;
  fc.forward_prefetch = forward_prefetch;
  fc.backward_prefetch = backward;
  Log log;
  RecordingCommunicator shard(2, log), replicate(replicas, log);
  fsdp::FsdpEngine engine(model.modules(), fc, fsdp::MixedPrecisionConfig{}, shard, replicate,
                          *be, 1, true);
  for (int u = 0; u < engine.num_units(); ++u) {
    const std::string n = u == 0 ? "root" : "h" + std::to_string(u - 1);
    shard.names[engine.shard_param(u).data] = n;
    shard.names[engine.shard_grad(u).data] = n;
    replicate.names[engine.shard_grad(u).data] = n;
  }
  const int M = static_cast<int>(model.modules().size());  // emb, h0, h1, h2, ln_f
  engine.begin_step(true);
  log.push_back("| fwd");
  for (int m = 0; m < M; ++m) {
    log.push_back("F" + std::to_string(m));
    engine.pre_forward(m);
    engine.post_forward(m);
  }
  log.push_back("| bwd");
  for (int m = M - 1; m >= 0; --m) {
    log.push_back("B" + std::to_string(m));
    engine.pre_backward(m);
    log.push_back("/B" + std::to_string(m));
    engine.post_backward(m);
  }
  log.push_back("| end");
  engine.end_step();
  return log;
}

// The gradient part is the same in every mode: a reduce-scatter per unit as its backward
// ends, none waited before end_step, all waited there in unit order.
const Log kEnd = {"| end", "wait RS root", "wait RS h0", "wait RS h1", "wait RS h2"};

Log concat(Log a, const Log& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Forward without prefetch: each unit is gathered when its first module starts.
const Log kFwdOnDemand = {"| fwd", "F0", "AG root", "wait AG root", "F1", "AG h0", "wait AG h0",
                          "F2", "AG h1", "wait AG h1", "F3", "AG h2", "wait AG h2", "F4"};

TEST(EngineSchedule, NoPrefetchGathersOnDemand) {
  // The root stays unsharded from forward to the end of backward; blocks are resharded
  // after their forward (FULL_SHARD) and gathered again when their backward starts.
  EXPECT_EQ(schedule(false, fsdp::BackwardPrefetch::NO_PREFETCH),
            concat(concat(kFwdOnDemand,
                          {"| bwd", "B4", "/B4", "B3", "AG h2", "wait AG h2", "/B3", "RS h2",
                           "B2", "AG h1", "wait AG h1", "/B2", "RS h1", "B1", "AG h0",
                           "wait AG h0", "/B1", "RS h0", "B0", "/B0", "RS root"}),
                   kEnd));
}

TEST(EngineSchedule, ForwardPrefetchIncludesTheFirstBlock) {
  // The root's forward (embeddings) prefetches h0, and each block the next one.
  EXPECT_EQ(schedule(true, fsdp::BackwardPrefetch::NO_PREFETCH),
            concat({"| fwd", "F0", "AG root", "wait AG root", "AG h0", "F1", "wait AG h0",
                    "AG h1", "F2", "wait AG h1", "AG h2", "F3", "wait AG h2", "F4",
                    "| bwd", "B4", "/B4", "B3", "AG h2", "wait AG h2", "/B3", "RS h2", "B2",
                    "AG h1", "wait AG h1", "/B2", "RS h1", "B1", "AG h0", "wait AG h0", "/B1",
                    "RS h0", "B0", "/B0", "RS root"},
                   kEnd));
}

TEST(EngineSchedule, BackwardPrePrefetchesBeforeEachUnitsBackward) {
  // ln_f (the root) starts backward: h2 is gathered; h2 starts: h1; h1 starts: h0.
  EXPECT_EQ(schedule(false, fsdp::BackwardPrefetch::BACKWARD_PRE),
            concat(concat(kFwdOnDemand,
                          {"| bwd", "B4", "AG h2", "/B4", "B3", "wait AG h2", "AG h1", "/B3",
                           "RS h2", "B2", "wait AG h1", "AG h0", "/B2", "RS h1", "B1",
                           "wait AG h0", "/B1", "RS h0", "B0", "/B0", "RS root"}),
                   kEnd));
}

TEST(EngineSchedule, BackwardPostPrefetchesBeforeTheReduceScatter) {
  // A unit's backward ends: the next unit's all-gather goes out before its reduce-scatter.
  // The root's backward ends last (embeddings), so it prefetches nothing.
  EXPECT_EQ(schedule(false, fsdp::BackwardPrefetch::BACKWARD_POST),
            concat(concat(kFwdOnDemand,
                          {"| bwd", "B4", "/B4", "B3", "AG h2", "wait AG h2", "/B3", "AG h1",
                           "RS h2", "B2", "wait AG h1", "/B2", "AG h0", "RS h1", "B1",
                           "wait AG h0", "/B1", "RS h0", "B0", "/B0", "RS root"}),
                   kEnd));
}

TEST(EngineSchedule, HybridAllReducesEachUnitAfterItsReduceScatter) {
  // HYBRID_SHARD over 2 shards x 2 replicas: in end_step each unit's reduce-scatter is waited
  // and its replica all-reduce issued, in unit order; then the all-reduces are waited.
  const Log log = schedule(false, fsdp::BackwardPrefetch::NO_PREFETCH, 2);
  const Log end(std::find(log.begin(), log.end(), "| end"), log.end());
  EXPECT_EQ(end, (Log{"| end", "wait RS root", "AR root", "wait RS h0", "AR h0", "wait RS h1",
                      "AR h1", "wait RS h2", "AR h2", "wait AR root", "wait AR h0",
                      "wait AR h1", "wait AR h2"}));
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& e) { return e.rfind("AR", 0) == 0; }), 4);
}

}  // namespace
