// fsdp/fsdp/module.hpp: what a model tells the FSDP engine, and what the engine gives back.
//
// The engine knows nothing about GPT or T5. A model declares its modules (name, class name,
// parameters) in forward order; the wrap policy groups modules into FSDP units (one
// FlatParameter each). While computing, the model brackets each module's forward and backward
// with the hooks below (PyTorch FSDP's pre/post forward and backward hooks) and reads
// parameter and gradient views through them.
#pragma once

#include <string>
#include <vector>

#include "fsdp/core/tensor.hpp"
#include "fsdp/fsdp/flat_param.hpp"

namespace fsdp {

struct ModuleDecl {
  std::string name;                 // e.g. "h.3", "embeddings"
  std::string cls;                  // class name for the wrap policy, e.g. "GPT2Block"
  std::vector<ParamSpec> params;    // owned parameters, in order
};

// Implemented by the engine; called by the model. `module` indexes the declared modules;
// `param` indexes all declared parameters in declaration order (module by module).
// A module is entered exactly once in forward and once in backward per step, and a module
// may read parameters of other modules of its own unit (e.g. the LM head reads the tied
// wte of the root unit).
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  // Unshards the module's unit if needed (all-gather). After it, param() is valid.
  virtual void pre_forward(int module) = 0;
  // May reshard the unit, per the sharding strategy.
  virtual void post_forward(int module) = 0;
  // Unshards the unit if needed and provides zeroed gradient storage on first use.
  virtual void pre_backward(int module) = 0;
  // After the unit's last module: reduce-scatter (and all-reduce) its gradient, reshard.
  virtual void post_backward(int module) = 0;
  // Unsharded parameter / gradient (accumulate into it) of declared parameter `param`: a
  // view with the ParamSpec's shape in the mixed-precision param_dtype (fp32, bf16 or fp16).
  // Throws fsdp::Error outside the unit's unshard window / backward.
  virtual TensorView param(int param) = 0;
  virtual TensorView grad(int param) = 0;
  // False during evaluation: no backward will follow (units reshard after forward).
  virtual bool training() const = 0;
};

}  // namespace fsdp
