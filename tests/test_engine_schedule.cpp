// The FSDP engine's communication schedule, observed exactly: a communicator of two ranks
// that records every collective (and every wait on one) drives a 3-block GPT-2's units
// through the ModuleHooks in the model's order, for each prefetch mode. Checks PyTorch
// FSDP's execution-order prefetch (the root prefetches the first block in forward and the
// last block in backward), that gradient reduce-scatters are issued per unit as its backward
// ends and waited only in end_step, that HYBRID_SHARD's replica all-reduce of a unit follows
// its reduce-scatter at once (ordered after the reduce-scatter's completion event, before the
// next unit's backward), that nothing else is gathered, and the units' TrainingState /
// ShardedState through a step and the errors of hooks called out of order. One process.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/gpt2.hpp"

namespace {

using Log = std::vector<std::string>;

// The log as long as its communicator lives (completion events outlive both: the backend's
// allocator keeps them with freed buffers and synchronizes them when it is destroyed).
struct LogRef {
  Log* log;
};

// A collective's completion event: a stream waiting on it (Stream::wait on a host stream
// synchronizes it) logs "ready <what>".
class RecordingEvent final : public fsdp::Event {
 public:
  RecordingEvent(std::shared_ptr<LogRef> log, std::string what)
      : log_(std::move(log)), what_(std::move(what)) {}
  void record(fsdp::Stream&) override {}
  void synchronize() override {
    if (log_->log) log_->log->push_back("ready " + what_);
  }
  bool query() override { return true; }

 private:
  std::shared_ptr<LogRef> log_;
  std::string what_;
};

class RecordingWork final : public fsdp::Work {
 public:
  RecordingWork(std::shared_ptr<LogRef> log, std::string what)
      : log_(std::move(log)), what_(std::move(what)) {}
  void wait() override {
    if (!waited_ && log_->log) log_->log->push_back("wait " + what_);
    waited_ = true;
  }
  std::shared_ptr<fsdp::Event> done() override {
    return std::make_shared<RecordingEvent>(log_, what_);
  }

 private:
  std::shared_ptr<LogRef> log_;
  std::string what_;
  bool waited_ = false;
};

// Rank 0 of `size` ranks; moves no data, names each buffer by the unit it belongs to.
class RecordingCommunicator final : public fsdp::Communicator {
 public:
  RecordingCommunicator(int size, Log& log)
      : size_(size), log_(std::make_shared<LogRef>(LogRef{&log})) {}
  ~RecordingCommunicator() override { log_->log = nullptr; }
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
    log_->log->push_back(what);
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
  std::shared_ptr<LogRef> log_;
  fsdp::HostStream stream_;
};

// A GPT-2 of `n_layer` blocks, 8 wide: units are what the schedule is about, not sizes.
fsdp::Gpt2Config tiny_gpt2(int n_layer) {
  fsdp::Gpt2Config mc;
  mc.n_layer = n_layer;
  mc.n_head = 2;
  mc.n_embd = 8;
  mc.n_positions = 8;
  mc.vocab_size = 16;
  return mc;
}

// Runs one training step's hooks (modules in order, then in reverse) and returns the log,
// with "| fwd", "| bwd", "| end" markers between the phases, "Fm" before module m's
// pre_forward, "Bm" before its pre_backward and "/Bm" before its post_backward. Modules:
// 0 embeddings (root), 1-3 blocks h0-h2, 4 ln_f (root).
Log schedule(bool forward_prefetch, fsdp::BackwardPrefetch backward, int replicas = 1,
             bool offload = false) {
  const fsdp::Gpt2Config mc = tiny_gpt2(3);
  auto be = fsdp::make_cpu_backend(1);
  fsdp::Gpt2Model model(mc, *be);
  fsdp::FsdpConfig fc;
  fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
  fc.sharding_strategy = replicas > 1 ? fsdp::ShardingStrategy::HYBRID_SHARD
                                      : fsdp::ShardingStrategy::FULL_SHARD;
  fc.forward_prefetch = forward_prefetch;
  fc.backward_prefetch = backward;
  fc.cpu_offload = offload;
  auto host = fsdp::make_cpu_backend(1);  // the offload runtime
  Log log;
  RecordingCommunicator shard(2, log), replicate(replicas, log);
  fsdp::FsdpEngine engine(model.modules(), fc, fsdp::MixedPrecisionConfig{}, shard, replicate,
                          *be, 1, true, offload ? host.get() : nullptr);
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

TEST(EngineSchedule, HybridAllReducesEachUnitRightAfterItsReduceScatter) {
  // HYBRID_SHARD over 2 shards x 2 replicas (PyTorch HSDP): as a unit's backward ends, its
  // reduce-scatter is issued, the reduction stream waits for its completion ("ready RS"),
  // and its replica all-reduce goes out at once, before the next unit's backward starts.
  // end_step waits the reduce-scatters, then the all-reduces (the compute stream waiting
  // for each: "ready AR"), in unit order.
  const Log log = schedule(false, fsdp::BackwardPrefetch::NO_PREFETCH, 2);
  EXPECT_EQ(log, concat(kFwdOnDemand,
                        {"| bwd", "B4", "/B4", "B3", "AG h2", "wait AG h2", "/B3", "RS h2",
                         "ready RS h2", "AR h2", "B2", "AG h1", "wait AG h1", "/B2", "RS h1",
                         "ready RS h1", "AR h1", "B1", "AG h0", "wait AG h0", "/B1", "RS h0",
                         "ready RS h0", "AR h0", "B0", "/B0", "RS root", "ready RS root",
                         "AR root", "| end", "wait RS root", "wait RS h0", "wait RS h1",
                         "wait RS h2", "wait AR root", "ready AR root", "wait AR h0",
                         "ready AR h0", "wait AR h1", "ready AR h1", "wait AR h2",
                         "ready AR h2"}));
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& e) { return e.rfind("AR", 0) == 0; }), 4);
}

TEST(EngineSchedule, HybridWithBackwardPrefetchKeepsEachAllReduceNextToItsReduceScatter) {
  // With BACKWARD_PRE / BACKWARD_POST the prefetches move, but every unit's all-reduce still
  // directly follows its reduce-scatter's completion, and the four go out in backward order.
  for (auto mode : {fsdp::BackwardPrefetch::BACKWARD_PRE, fsdp::BackwardPrefetch::BACKWARD_POST}) {
    const Log log = schedule(false, mode, 2);
    const auto end = std::find(log.begin(), log.end(), "| end");
    Log reductions;
    for (auto it = log.begin(); it != end; ++it) {
      if (it->rfind("RS", 0) == 0 || it->rfind("ready RS", 0) == 0 || it->rfind("AR", 0) == 0) {
        reductions.push_back(*it);
      }
    }
    EXPECT_EQ(reductions, (Log{"RS h2", "ready RS h2", "AR h2", "RS h1", "ready RS h1", "AR h1",
                               "RS h0", "ready RS h0", "AR h0", "RS root", "ready RS root",
                               "AR root"}));
    for (const char* u : {"h2", "h1", "h0", "root"}) {
      const auto rs = std::find(log.begin(), log.end(), std::string("RS ") + u);
      ASSERT_NE(rs, log.end());
      EXPECT_EQ(*(rs + 1), std::string("ready RS ") + u);
      EXPECT_EQ(*(rs + 2), std::string("AR ") + u);
    }
  }
}

// The collectives alone, in issue order, without the buffers' names ("AG", "RS", "AR").
Log collectives(const Log& log) {
  Log out;
  for (const std::string& e : log) {
    if (e.rfind("AG", 0) == 0 || e.rfind("RS", 0) == 0 || e.rfind("AR", 0) == 0) {
      out.push_back(e.substr(0, 2));
    }
  }
  return out;
}

TEST(EngineSchedule, OffloadIssuesTheSameCollectivesInTheSameOrder) {
  // Uploads and host staging add no collective and move none: every rank still issues the
  // same sequence, whatever the prefetch mode.
  for (auto mode : {fsdp::BackwardPrefetch::NO_PREFETCH, fsdp::BackwardPrefetch::BACKWARD_PRE,
                    fsdp::BackwardPrefetch::BACKWARD_POST}) {
    for (int replicas : {1, 2}) {
      const Log plain = schedule(true, mode, replicas);
      const Log off = schedule(true, mode, replicas, /*offload=*/true);
      EXPECT_EQ(collectives(off), collectives(plain)) << fsdp::to_string(mode) << " x" << replicas;
      EXPECT_GE(collectives(off).size(), 8u);
    }
  }
}

// An offloaded (fsdp.cpu_offload) tiny GPT-2 engine over the recording communicator, its
// host runtime apart.
struct OffloadedEngine {
  OffloadedEngine(int n_layer, int shards, fsdp::DType param_dtype, bool initialise)
      : model(tiny_gpt2(n_layer), *be), shard(shards, log), replicate(1, log) {
    fsdp::FsdpConfig fc;
    fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
    fc.cpu_offload = true;
    fsdp::MixedPrecisionConfig mp;
    mp.param_dtype = param_dtype;
    engine = std::make_unique<fsdp::FsdpEngine>(model.modules(), fc, mp, shard, replicate, *be,
                                                1, initialise, host.get());
  }
  std::unique_ptr<fsdp::Backend> be = fsdp::make_cpu_backend(1);
  std::unique_ptr<fsdp::Backend> host = fsdp::make_cpu_backend(1);
  fsdp::Gpt2Model model;
  Log log;
  RecordingCommunicator shard, replicate;
  std::unique_ptr<fsdp::FsdpEngine> engine;
};

TEST(EngineSchedule, AnOffloadedUnshardBeforeTheShardsWereWrittenThrows) {
  // An engine built without initialisation has no param_dtype host copies yet: uploading
  // them would send garbage, so the first unshard names the missing call.
  OffloadedEngine e(1, 2, fsdp::DType::bf16, /*initialise=*/false);
  fsdp::FsdpEngine& engine = *e.engine;
  engine.begin_step(false);
  try {
    engine.pre_forward(0);
    ADD_FAILURE() << "an unshard before the shards were written did not throw";
  } catch (const fsdp::Error& err) {
    EXPECT_NE(std::string(err.what()).find("write_shards"), std::string::npos) << err.what();
  }
  engine.end_step();
  engine.write_shards([] {});
  engine.begin_step(false);
  EXPECT_NO_THROW(engine.pre_forward(0));
  engine.post_forward(0);
  engine.end_step();
}

// Offload (issue 31 item 4): update_shards returns while its host thread still writes, the
// next pass's first unit is unsharded as soon as its own write is done (the last unit's
// write is held until then, so an engine that waited for every write would fail here, not
// hang: the hold ends after 60 s), and an exception of a write reaches the next wait.
TEST(EngineSchedule, AnOffloadedUpdateOverlapsTheNextForwardUnitByUnit) {
  OffloadedEngine e(2, 1, fsdp::DType::f32, /*initialise=*/true);
  fsdp::FsdpEngine& engine = *e.engine;
  const fsdp::Gpt2Model& model = e.model;
  const int last = engine.num_units() - 1;  // h.1: units are the root, h.0, h.1
  ASSERT_EQ(last, 2);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<int> order;
  std::mutex order_mutex;
  engine.update_shards([&](int u, const fsdp::TensorView&) {
    if (u == last && released.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      throw std::runtime_error("the last unit's write was never released");
    }
    const std::lock_guard<std::mutex> lock(order_mutex);
    order.push_back(u);
  });
  engine.begin_step(false);
  engine.pre_forward(0);  // wte, a root module: unit 0 is written and unsharded
  engine.post_forward(0);
  {
    const std::lock_guard<std::mutex> lock(order_mutex);
    ASSERT_FALSE(order.empty());
    EXPECT_EQ(order.front(), 0);  // forward order: the root first
    EXPECT_EQ(std::count(order.begin(), order.end(), last), 0);  // still held
  }
  release.set_value();
  for (int m = 1; m < static_cast<int>(model.modules().size()); ++m) {
    engine.pre_forward(m);
    engine.post_forward(m);
  }
  engine.end_step();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));

  engine.update_shards([](int u, const fsdp::TensorView&) {
    if (u == 1) throw fsdp::Error("write of unit 1 failed");
  });
  try {
    engine.wait_shard_writes();
    ADD_FAILURE() << "the write's exception did not reach the wait";
  } catch (const fsdp::Error& err) {
    EXPECT_NE(std::string(err.what()).find("unit 1 failed"), std::string::npos) << err.what();
  }
  EXPECT_NO_THROW(engine.wait_shard_writes());  // reported once
}

// A FULL_SHARD engine over the recording communicator for the state tests.
struct StateFixture {
  StateFixture() {
    model = std::make_unique<fsdp::Gpt2Model>(mc, *be);
    fc.transformer_layer_cls_to_wrap = {"GPT2Block"};
    engine = std::make_unique<fsdp::FsdpEngine>(model->modules(), fc,
                                                fsdp::MixedPrecisionConfig{}, shard, replicate,
                                                *be, 1, true);
  }
  fsdp::Gpt2Config mc = tiny_gpt2(2);
  fsdp::FsdpConfig fc;
  std::unique_ptr<fsdp::Backend> be = fsdp::make_cpu_backend(1);
  std::unique_ptr<fsdp::Gpt2Model> model;
  Log log;
  RecordingCommunicator shard{2, log}, replicate{1, log};
  std::unique_ptr<fsdp::FsdpEngine> engine;
};

TEST(EngineState, FollowsFsdp2TrainingAndShardedStatesThroughAStep) {
  using fsdp::ShardedState;
  using fsdp::TrainingState;
  StateFixture f;
  auto& e = *f.engine;  // modules: 0 embeddings (root), 1 h.0, 2 h.1, 3 ln_f (root)
  for (int u = 0; u < e.num_units(); ++u) {
    EXPECT_EQ(e.training_state(u), TrainingState::IDLE);
    EXPECT_EQ(e.sharded_state(u), ShardedState::SHARDED);
    EXPECT_EQ(e.grad_state(u), fsdp::GradState::EMPTY);
  }
  e.begin_step(true);
  e.pre_forward(0);
  EXPECT_EQ(e.training_state(0), TrainingState::FORWARD);
  EXPECT_EQ(e.sharded_state(0), ShardedState::UNSHARDED);
  e.post_forward(0);
  EXPECT_EQ(e.training_state(0), TrainingState::FORWARD);  // ln_f is still to come
  e.pre_forward(1);
  EXPECT_EQ(e.training_state(1), TrainingState::FORWARD);
  e.post_forward(1);
  EXPECT_EQ(e.training_state(1), TrainingState::IDLE);
  EXPECT_EQ(e.sharded_state(1), ShardedState::SHARDED);  // FULL_SHARD: resharded
  EXPECT_THROW(e.post_forward(1), fsdp::Error);           // its forward already ended
  EXPECT_THROW(e.pre_backward(2), fsdp::Error);           // h.1's forward has not run
  for (int m : {2, 3}) {
    e.pre_forward(m);
    e.post_forward(m);
  }
  EXPECT_EQ(e.training_state(0), TrainingState::IDLE);
  EXPECT_EQ(e.sharded_state(0), ShardedState::UNSHARDED);  // the root stays unsharded
  EXPECT_THROW(e.post_backward(3), fsdp::Error);          // before its pre_backward
  e.pre_backward(3);
  EXPECT_EQ(e.training_state(0), TrainingState::PRE_BACKWARD);
  e.post_backward(3);
  EXPECT_EQ(e.training_state(0), TrainingState::PRE_BACKWARD);  // embeddings still to come
  e.pre_backward(2);
  EXPECT_EQ(e.training_state(2), TrainingState::PRE_BACKWARD);
  EXPECT_EQ(e.sharded_state(2), ShardedState::UNSHARDED);
  EXPECT_NO_THROW(e.grad(0));  // parameter 0 (wte) is the root's, in PRE_BACKWARD
  e.post_backward(2);
  EXPECT_EQ(e.training_state(2), TrainingState::POST_BACKWARD);
  EXPECT_EQ(e.sharded_state(2), ShardedState::SHARDED);
  EXPECT_EQ(e.grad_state(2), fsdp::GradState::ACCUMULATED);
  EXPECT_THROW(e.pre_backward(2), fsdp::Error);  // its gradient is already being reduced
  EXPECT_THROW(e.pre_forward(2), fsdp::Error);
  for (int m : {1, 0}) {
    e.pre_backward(m);
    e.post_backward(m);
  }
  EXPECT_THROW(e.begin_step(true), fsdp::Error);  // the pass was not ended
  e.end_step();
  for (int u = 0; u < e.num_units(); ++u) {
    EXPECT_EQ(e.training_state(u), TrainingState::IDLE);
    EXPECT_EQ(e.sharded_state(u), ShardedState::SHARDED);
    EXPECT_EQ(e.grad_state(u), fsdp::GradState::ACCUMULATED);
  }
  e.zero_grad();
  EXPECT_EQ(e.grad_state(0), fsdp::GradState::EMPTY);
}

TEST(EngineState, EvaluationHasNoBackwardAndAnAbortedPassEndsIdle) {
  using fsdp::TrainingState;
  StateFixture f;
  auto& e = *f.engine;
  e.begin_step(false);
  e.pre_forward(0);
  e.post_forward(0);
  e.pre_forward(1);
  try {
    e.pre_backward(1);
    ADD_FAILURE() << "pre_backward in evaluation did not throw";
  } catch (const fsdp::Error& err) {
    EXPECT_NE(std::string(err.what()).find("evaluation"), std::string::npos) << err.what();
  }
  e.end_step();  // a pass cut short: every unit IDLE and SHARDED again
  for (int u = 0; u < e.num_units(); ++u) {
    EXPECT_EQ(e.training_state(u), TrainingState::IDLE);
    EXPECT_EQ(e.sharded_state(u), fsdp::ShardedState::SHARDED);
  }
  EXPECT_NO_THROW(e.begin_step(true));
  try {
    e.grad(0);
    ADD_FAILURE() << "grad outside backward did not throw";
  } catch (const fsdp::Error& err) {
    EXPECT_NE(std::string(err.what()).find("IDLE"), std::string::npos) << err.what();
  }
}

}  // namespace
