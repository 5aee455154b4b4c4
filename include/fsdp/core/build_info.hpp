// The identity of this build of fsdp_train, what `fsdp_train --version` prints, the banner
// shows and the ranks compare at start-up (one executable on every node).
#pragma once

namespace fsdp {

// "0.1.0+g<12 hex digits of the git commit>[.dirty.<8 hex digits of the uncommitted diff>]
// (<build type>, <CPU only | CUDA archs>)", e.g. "0.1.0+g00a7ef0c1a2b (Release, CUDA 80;90)";
// "+unknown" instead of the commit when built outside a git checkout. Written at every build
// by tools/build_info.cmake (CMakeLists.txt's fsdp_build_info target); never throws.
const char* build_id();

}  // namespace fsdp
