// The counting backend (see fsdp/backend/counting_backend.hpp).
#include "fsdp/backend/counting_backend.hpp"

#include <sstream>

namespace fsdp {

bool GemmCall::sixteen_bit() const {
  auto half = [](DType t) { return t == DType::bf16 || t == DType::f16; };
  return half(a) || half(b) || half(c);
}

std::string to_string(const GemmCall& g) {
  std::ostringstream os;
  os << "gemm(trans_a=" << g.trans_a << ", trans_b=" << g.trans_b << ", M=" << g.M
     << ", N=" << g.N << ", K=" << g.K << ", lda=" << g.lda() << ", ldb=" << g.ldb()
     << ", ldc=" << g.ldc() << ", " << to_string(g.a) << " x " << to_string(g.b) << " -> "
     << to_string(g.c) << ")";
  return os.str();
}

std::vector<GemmCall> misaligned_gemms(const std::vector<GemmCall>& gemms, int64_t multiple) {
  std::vector<GemmCall> out;
  for (const GemmCall& g : gemms) {
    if (!g.sixteen_bit()) continue;
    for (int64_t d : {g.M, g.N, g.K, g.lda(), g.ldb(), g.ldc()}) {
      if (d % multiple != 0) {
        out.push_back(g);
        break;
      }
    }
  }
  return out;
}

std::unique_ptr<Stream> CountingBackend::create_stream() { return std::make_unique<HostStream>(); }
std::unique_ptr<Event> CountingBackend::create_event() { return std::make_unique<HostEvent>(); }

void* CountingBackend::allocate(std::size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  memory_.on_alloc(category, bytes);
  next_ += CachingAllocator::round_size(bytes) + 512;
  return reinterpret_cast<void*>(next_);
}

void CountingBackend::deallocate(void* ptr, std::size_t bytes, MemCategory category,
                                 std::shared_ptr<Event>) noexcept {
  if (ptr) memory_.on_free(category, bytes);
}

void CountingBackend::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float,
                           const TensorView& A, const TensorView& B, float, const TensorView& C) {
  if (record_gemms_) gemms_.push_back({trans_a, trans_b, M, N, K, A.dtype, B.dtype, C.dtype});
}

}  // namespace fsdp
