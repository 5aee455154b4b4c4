// tests/test_lr_schedule.cpp: the learning-rate schedules of optim.lr_scheduler_type
// (fsdp/optim/optimizer.hpp learning_rate), step by step against values worked out by hand:
// lr 1.0, min_lr 0.1, warmup 4 steps, the decay ending at step 12 (decay_steps, or
// train.max_steps when 0), WSD's decay the last 4 of those steps.
#include <gtest/gtest.h>

#include <cmath>

#include "fsdp/config/config.hpp"
#include "fsdp/optim/optimizer.hpp"

namespace {

using fsdp::DecayType;
using fsdp::LrSchedulerType;

fsdp::OptimConfig schedule(LrSchedulerType type) {
  fsdp::OptimConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.decay_steps = 12;
  o.lr_scheduler_type = type;
  return o;
}

constexpr double kPi = 3.14159265358979323846;

// Warmup is the same for all: lr * s / W, never 0 at the first step.
TEST(LrSchedule, WarmupIsLinearFromTheFirstStep) {
  for (auto t : {LrSchedulerType::cosine, LrSchedulerType::linear,
                 LrSchedulerType::constant_with_warmup, LrSchedulerType::warmup_stable_decay}) {
    fsdp::OptimConfig o = schedule(t);
    o.num_decay_steps = 4;
    for (int s = 1; s <= 4; ++s) EXPECT_DOUBLE_EQ(fsdp::learning_rate(o, 100, s), s / 4.0) << s;
  }
}

TEST(LrSchedule, CosineAndLinearDecayToMinLrAtDecaySteps) {
  const fsdp::OptimConfig cos = schedule(LrSchedulerType::cosine);
  const fsdp::OptimConfig lin = schedule(LrSchedulerType::linear);
  for (int s = 5; s <= 11; ++s) {  // (s - 4) / 8 of the way from lr to min_lr
    const double p = (s - 4) / 8.0;
    EXPECT_DOUBLE_EQ(fsdp::learning_rate(cos, 100, s), 0.1 + 0.9 * 0.5 * (1 + std::cos(kPi * p)))
        << s;
    EXPECT_DOUBLE_EQ(fsdp::learning_rate(lin, 100, s), 0.1 + 0.9 * (1 - p)) << s;
  }
  EXPECT_DOUBLE_EQ(fsdp::learning_rate(lin, 100, 8), 0.55);  // half way
  for (int s : {12, 13, 50}) {
    EXPECT_EQ(fsdp::learning_rate(cos, 100, s), 0.1) << s;
    EXPECT_EQ(fsdp::learning_rate(lin, 100, s), 0.1) << s;
  }
  // decay_steps 0: the decay ends at train.max_steps.
  fsdp::OptimConfig to_max = lin;
  to_max.decay_steps = 0;
  EXPECT_DOUBLE_EQ(fsdp::learning_rate(to_max, 20, 12), 0.1 + 0.9 * (1 - 8.0 / 16));
  EXPECT_EQ(fsdp::learning_rate(to_max, 20, 20), 0.1);
}

TEST(LrSchedule, ConstantWithWarmupStaysAtLr) {
  const fsdp::OptimConfig o = schedule(LrSchedulerType::constant_with_warmup);
  for (int s : {5, 11, 12, 1000}) EXPECT_EQ(fsdp::learning_rate(o, 100, s), 1.0) << s;
}

// WSD: stable at lr through step 8 = 12 - 4, then the decay over steps 9..12, p = (s - 8) / 4.
TEST(LrSchedule, WarmupStableDecayHoldsThenDecaysByItsType) {
  for (auto d : {DecayType::cosine, DecayType::linear, DecayType::one_minus_sqrt}) {
    fsdp::OptimConfig o = schedule(LrSchedulerType::warmup_stable_decay);
    o.num_decay_steps = 4;
    o.decay_type = d;
    for (int s = 5; s <= 8; ++s) EXPECT_EQ(fsdp::learning_rate(o, 100, s), 1.0) << s;
    for (int s = 9; s <= 11; ++s) {
      const double p = (s - 8) / 4.0;
      const double f = d == DecayType::linear           ? 1 - p
                       : d == DecayType::one_minus_sqrt ? 1 - std::sqrt(p)
                                                        : 0.5 * (1 + std::cos(kPi * p));
      EXPECT_DOUBLE_EQ(fsdp::learning_rate(o, 100, s), 0.1 + 0.9 * f) << s;
    }
    EXPECT_EQ(fsdp::learning_rate(o, 100, 12), 0.1);
    EXPECT_EQ(fsdp::learning_rate(o, 100, 13), 0.1);
  }
  fsdp::OptimConfig o = schedule(LrSchedulerType::warmup_stable_decay);
  o.num_decay_steps = 4;
  o.decay_type = DecayType::one_minus_sqrt;
  EXPECT_DOUBLE_EQ(fsdp::learning_rate(o, 100, 9), 0.1 + 0.9 * 0.5);  // 1 - sqrt(1/4)
}

}  // namespace
