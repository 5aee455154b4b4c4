// tests/model_fixture.hpp: one causal LM (GPT-2 or Llama) under a one-process FSDP engine on
// the CPU backend, with a random batch, for the models' finite-difference and reference
// tests (test_model.cpp, test_llama.cpp).
#pragma once

#include <mpi.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/comm/mpi_communicator.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/model/causal_lm.hpp"

namespace test_util {

// The model's options: its configuration, activations in mp.param_dtype, optional
// activation checkpointing, the communicator the engine shards over (MPI_COMM_SELF: one
// rank) and the batch shape.
template <class ModelConfig>
struct CausalLmOptions {
  ModelConfig model;
  fsdp::MixedPrecisionConfig mp{};
  fsdp::ActivationCheckpointing activation_checkpointing;  // none
  MPI_Comm comm = MPI_COMM_SELF;
  int64_t B = 2, T = 6;
};

// `Model` built from `o`, its engine over `fc` (seed 42), and B x T random tokens and targets
// (seed 3) of the model's vocabulary.
template <class Model, class ModelConfig>
struct CausalLmFixture {
  std::unique_ptr<fsdp::Backend> be = fsdp::make_cpu_backend(1);
  fsdp::MpiCommunicator comm;
  fsdp::DeviceMesh mesh;
  Model model;
  fsdp::FsdpEngine engine;
  fsdp::DeviceBuffer loss_dev{*be, fsdp::DType::f64, 1, fsdp::MemCategory::other};
  std::vector<int32_t> tokens, targets;
  int64_t B, T;
  // Document masking of the batch (CausalLm::forward_backward's docs): none unless a test
  // sets it (positions [B,T] pointing into the test's storage).
  fsdp::Documents docs;

  CausalLmFixture(const CausalLmOptions<ModelConfig>& o, const fsdp::FsdpConfig& fc)
      : comm(o.comm),
        mesh(fsdp::DeviceMesh::create(comm, 0)),
        model(o.model, *be, o.mp.param_dtype, o.activation_checkpointing),
        engine(model.modules(), fc, o.mp, mesh, *be, 42),
        B(o.B),
        T(o.T) {
    std::mt19937 gen(3);
    const auto V = static_cast<uint32_t>(o.model.vocab_size);
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.push_back(static_cast<int32_t>(gen() % V));
      targets.push_back(static_cast<int32_t>(gen() % V));
    }
  }
  // Mean cross-entropy, in double from the kernels' double sums.
  double read_loss() {
    double s = 0;
    be->copy_to_host(&s, loss_dev.view());
    return s / static_cast<double>(B * T);
  }
  double loss() {
    be->fill_zero(loss_dev.view());
    engine.begin_step(false);
    model.forward_loss(tokens.data(), targets.data(), B, T, engine, loss_dev.view(), docs);
    engine.end_step();
    return read_loss();
  }
  // grad_scale 0: 1 / (B*T), the mean's.
  double loss_and_grads(float grad_scale = 0.f) {
    be->fill_zero(loss_dev.view());
    engine.zero_grad();
    engine.begin_step(true);
    model.forward_backward(tokens.data(), targets.data(), B, T,
                           grad_scale != 0.f ? grad_scale : 1.f / static_cast<float>(B * T),
                           engine, loss_dev.view(), docs);
    engine.end_step();
    return read_loss();
  }
};

// Gradient shards summed over runs (document masking's tests: a packed row's gradients are
// the sum of its documents' run alone), one vector per unit.
using UnitGrads = std::vector<std::vector<float>>;

// sum[u] += fixture f's gradient shard of unit u (sized on first use).
template <class F>
void add_grads(F& f, UnitGrads& sum) {
  sum.resize(static_cast<std::size_t>(f.engine.num_units()));
  for (int u = 0; u < f.engine.num_units(); ++u) {
    const float* g = f.engine.shard_grad(u).f32();
    auto& s = sum[static_cast<std::size_t>(u)];
    s.resize(static_cast<std::size_t>(f.engine.shard_numel(u)), 0.f);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += g[i];
  }
}

// Fixture f's gradient shards equal `want` within tol times the unit's largest |want| (+1e-7
// absolute), each unit's nonzero.
template <class F>
void expect_grads_near(F& f, const UnitGrads& want, double tol, const std::string& what) {
  ASSERT_EQ(want.size(), static_cast<std::size_t>(f.engine.num_units())) << what;
  for (int u = 0; u < f.engine.num_units(); ++u) {
    const float* g = f.engine.shard_grad(u).f32();
    const auto& w = want[static_cast<std::size_t>(u)];
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      err = std::max(err, static_cast<double>(std::abs(g[i] - w[i])));
      norm = std::max(norm, static_cast<double>(std::abs(w[i])));
    }
    EXPECT_GT(norm, 0.0) << what << ": unit " << u;
    EXPECT_LE(err, tol * norm + 1e-7) << what << ": unit " << u << " gradient";
  }
}

}  // namespace test_util
