// Agreement on failures across ranks (see fsdp/train/collective_guard.hpp).
#include "fsdp/train/collective_guard.hpp"

#include <climits>
#include <cstdint>
#include <string>

namespace fsdp {

void collective_guard(Communicator& world, const std::function<void()>& phase) {
  bool failed = false;
  int code = 0;
  std::string message;
  try {
    phase();
  } catch (const PeerFailed& e) {  // a nested guard already agreed; keep its code
    failed = true;
    code = e.exit_code();
  } catch (const Error& e) {
    failed = true;
    code = e.exit_code();
    message = e.what();
  } catch (const std::exception& e) {
    failed = true;
    code = kExitRuntimeError;
    message = e.what();
  }
  // [max exit code, -(lowest failing rank)] in one all-reduce (max).
  int32_t v[2] = {code, failed ? -world.rank() : INT32_MIN};
  world.all_reduce(v, v, 2, DType::i32, ReduceOp::max)->wait();
  if (v[0] == 0) return;
  if (failed && -v[1] == world.rank() && !message.empty()) throw AgreedFailure(message, v[0]);
  throw PeerFailed(v[0]);
}

}  // namespace fsdp
