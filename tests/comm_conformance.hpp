// tests/comm_conformance.hpp: the Communicator conformance checks (nccl-tests style), shared
// by tests/test_comm.cpp (MpiCommunicator, host memory, under mpirun at 1, 2 and 4 ranks)
// and tests/test_nccl_comm.cpp (NcclCommunicator and StagedCommunicator, device memory).
//
// The bodies use only the Communicator interface and a TestMemory (where the buffers live:
// host memory, or device memory with a device default stream), so every communicator runs
// the same checks: all_gather, reduce_scatter, all_reduce and broadcast, in place and out of
// place, for every dtype (fp32, fp64, bf16, fp16, int32, int64, uint8), every op (sum, max,
// and avg for floating dtypes) and counts 0, 1, 1023 and 2^20 + 1 (fp32 only); and the cases
// with nothing to exchange (count 0, a group of one) on their own (trivial_cases). Inputs are
// small integers (times 1/4 or 1/2 for floats) from a formula of (rank, index), so every
// expected value, every partial sum in any order, and avg with a power-of-two size are exact
// in every dtype: results must match bit for bit (avg with another size: within 2 ulps of
// sum * (1/size)). Each rank counts its wrong elements; the counts are summed over ranks with
// the communicator's own all_reduce, and each case expects 0 with a message naming
// collective, dtype, op, count and in-place.
//
// Results are read back after Work::wait() and default_stream().synchronize() only (plus
// done()->synchronize() / query() in work_done_event), so a communicator that does not order
// its collective before the issuing stream fails here. TestMemory::upload must leave the data
// visible to any stream when it returns.
//
// device_mesh() builds meshes with DeviceMesh::create, which moves host values through the
// communicator: it needs a host-memory communicator. mesh_map() checks DeviceMesh::map from
// a host communicator to the communicators `make` returns (with buffers in `mem`).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/communicator.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/core/error.hpp"

namespace conformance {

using fsdp::Communicator;
using fsdp::DType;
using fsdp::ReduceOp;
using fsdp::Stream;

// Where the buffers a communicator reads and writes live (host or device memory).
class TestMemory {
 public:
  virtual ~TestMemory() = default;
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, std::size_t bytes) = 0;
};

class HostMemory final : public TestMemory {
 public:
  void* alloc(std::size_t bytes) override { return bytes ? std::malloc(bytes) : nullptr; }
  void release(void* p) override { std::free(p); }
  void upload(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};

// A buffer in TestMemory, released on scope exit.
class Buffer {
 public:
  Buffer(TestMemory& mem, std::size_t bytes) : mem_(mem), p_(mem.alloc(bytes)), bytes_(bytes) {}
  ~Buffer() { mem_.release(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* get() const { return static_cast<char*>(p_); }

 private:
  TestMemory& mem_;
  void* p_;
  std::size_t bytes_;
};

inline const std::vector<DType> kDTypes = {DType::f32, DType::f64, DType::bf16, DType::f16,
                                    DType::i32, DType::i64, DType::u8};

inline std::vector<ReduceOp> ops_for(DType t) {
  if (fsdp::is_floating(t)) return {ReduceOp::sum, ReduceOp::max, ReduceOp::avg};
  return {ReduceOp::sum, ReduceOp::max};
}

inline std::vector<std::size_t> counts_for(DType t, bool large) {
  std::vector<std::size_t> c = {0, 1, 1023};
  if (large && t == DType::f32) c.push_back((std::size_t{1} << 20) + 1);
  return c;
}

// ---- host-side element codec: exact for every value the formulas produce ----
inline void put(DType t, std::vector<char>& h, std::size_t i, double v) {
  char* p = h.data() + i * fsdp::dtype_size(t);
  switch (t) {
    case DType::f32: { const float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case DType::f64: std::memcpy(p, &v, 8); break;
    case DType::bf16: { const uint16_t x = fsdp::f32_to_bf16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case DType::f16: { const uint16_t x = fsdp::f32_to_f16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case DType::i32: { const auto x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DType::i64: { const auto x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
    case DType::u8: { const auto x = static_cast<uint8_t>(v); std::memcpy(p, &x, 1); break; }
  }
}

inline double get(DType t, const std::vector<char>& h, std::size_t i) {
  const char* p = h.data() + i * fsdp::dtype_size(t);
  switch (t) {
    case DType::f32: { float x; std::memcpy(&x, p, 4); return x; }
    case DType::f64: { double x; std::memcpy(&x, p, 8); return x; }
    case DType::bf16: { uint16_t x; std::memcpy(&x, p, 2); return fsdp::bf16_to_f32(x); }
    case DType::f16: { uint16_t x; std::memcpy(&x, p, 2); return fsdp::f16_to_f32(x); }
    case DType::i32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::i64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
    case DType::u8: { uint8_t x; std::memcpy(&x, p, 1); return x; }
  }
  return 0;
}

// ---- per-rank inputs ----
// all_gather / broadcast: values in [-49.5, 49.5] step 0.5 (floats), [-99, 99] (int32),
// the same times 2^33 plus a low part (int64: both words matter), [0, 250] (uint8).
inline double gather_value(DType t, int r, std::size_t i) {
  const auto k = static_cast<int64_t>((static_cast<std::size_t>(r) * 37 + i * 11) % 199) - 99;
  switch (t) {
    case DType::i32: return static_cast<double>(k);
    case DType::i64: return static_cast<double>(k * (int64_t{1} << 33) + (r + 1));
    case DType::u8: return static_cast<double>((static_cast<std::size_t>(r) * 37 + i * 11) % 251);
    default: return 0.5 * static_cast<double>(k);
  }
}

// reduce: sum/avg inputs in [-8, 8] (x 1/4 for floats; [0, 16] for uint8), so any partial
// sum over <= 15 ranks is exact in every dtype; max inputs in [-11, 11] (x 1/2; uint8
// [0, 22]).
inline double reduce_value(DType t, ReduceOp op, int r, std::size_t i) {
  const auto ru = static_cast<std::size_t>(r);
  if (op == ReduceOp::max) {
    const auto k = static_cast<int64_t>((ru * 5 + i * 3) % 23);
    if (t == DType::u8) return static_cast<double>(k);
    return fsdp::is_floating(t) ? 0.5 * static_cast<double>(k - 11) : static_cast<double>(k - 11);
  }
  const auto k = static_cast<int64_t>((ru * 3 + i * 5) % 17);
  if (t == DType::u8) return static_cast<double>(k);
  return fsdp::is_floating(t) ? 0.25 * static_cast<double>(k - 8) : static_cast<double>(k - 8);
}

inline double expected_reduce(DType t, ReduceOp op, int size, std::size_t i) {
  double acc = reduce_value(t, op, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = reduce_value(t, op, r, i);
    acc = op == ReduceOp::max ? std::max(acc, v) : acc + v;
  }
  return op == ReduceOp::avg ? acc / size : acc;
}

inline bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Exact, except avg over a non-power-of-two size: within 2 ulps of the dtype.
inline bool matches(DType t, ReduceOp op, int size, double got, double want) {
  if (got == want) return true;
  if (op != ReduceOp::avg || power_of_two(size)) return false;
  const double eps = t == DType::f64 ? 0x1p-52 : t == DType::f32 ? 0x1p-23 : t == DType::bf16 ? 0x1p-7 : 0x1p-10;
  return std::fabs(got - want) <= 2 * eps * std::max(1.0, std::fabs(want));
}

// One checked case; `wrong` is this rank's count of wrong elements.
struct Case {
  std::string name;
  int64_t wrong = 0;
};

inline std::string describe(const char* coll, DType t, const char* op, std::size_t count, const char* place) {
  std::ostringstream os;
  os << coll << " dtype=" << fsdp::to_string(t) << " op=" << op << " count=" << count << " " << place;
  return os.str();
}

// Sums the wrong counts over ranks (the communicator's own all_reduce) and expects 0.
inline void expect_all_zero(Communicator& comm, TestMemory& mem, const std::vector<Case>& cases) {
  std::vector<char> h(cases.size() * 8);
  for (std::size_t k = 0; k < cases.size(); ++k) put(DType::i64, h, k, static_cast<double>(cases[k].wrong));
  Buffer d(mem, h.size());
  mem.upload(d.get(), h.data(), h.size());
  comm.all_reduce(d.get(), d.get(), cases.size(), DType::i64, ReduceOp::sum)->wait();
  comm.default_stream().synchronize();
  mem.download(h.data(), d.get(), h.size());
  for (std::size_t k = 0; k < cases.size(); ++k) {
    int64_t wrong = 0;
    std::memcpy(&wrong, h.data() + k * 8, 8);
    EXPECT_EQ(wrong, 0) << cases[k].name << ": " << wrong << " wrong elements summed over "
                        << comm.size() << " ranks (recv, or send changed out of place)";
  }
}

inline constexpr unsigned char kSentinel = 0xA5;  // fills recv before a collective

inline void all_gather(Communicator& comm, TestMemory& mem, bool large = true) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<Case> cases;
  for (DType t : kDTypes) {
    const std::size_t es = fsdp::dtype_size(t);
    for (std::size_t count : counts_for(t, large)) {
      for (bool in_place : {false, true}) {
        Case c{describe("all_gather", t, "-", count, in_place ? "in-place" : "out-of-place")};
        std::vector<char> send_h(count * es), recv_h(size * count * es, static_cast<char>(kSentinel));
        for (std::size_t i = 0; i < count; ++i) put(t, send_h, i, gather_value(t, rank, i));
        Buffer recv(mem, recv_h.size()), sep(mem, in_place ? 0 : send_h.size());
        char* send = in_place ? recv.get() + rank * count * es : sep.get();
        mem.upload(recv.get(), recv_h.data(), recv_h.size());
        mem.upload(send, send_h.data(), send_h.size());
        if (in_place) {
          comm.all_gather(send, recv.get(), count, t)->wait();
        } else {
          comm.all_gather(send, recv.get(), count, t, comm.default_stream())->wait();
        }
        comm.default_stream().synchronize();
        mem.download(recv_h.data(), recv.get(), recv_h.size());
        for (int r = 0; r < size; ++r) {
          for (std::size_t i = 0; i < count; ++i) {
            c.wrong += get(t, recv_h, r * count + i) != gather_value(t, r, i);
          }
        }
        if (!in_place) {
          std::vector<char> after(send_h.size());
          mem.download(after.data(), send, after.size());
          for (std::size_t i = 0; i < count; ++i) c.wrong += std::memcmp(&after[i * es], &send_h[i * es], es) != 0;
        }
        cases.push_back(c);
      }
    }
  }
  expect_all_zero(comm, mem, cases);
}

inline void reduce_scatter(Communicator& comm, TestMemory& mem, bool large = true) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<Case> cases;
  for (DType t : kDTypes) {
    const std::size_t es = fsdp::dtype_size(t);
    for (ReduceOp op : ops_for(t)) {
      for (std::size_t count : counts_for(t, large)) {
        for (bool in_place : {false, true}) {
          Case c{describe("reduce_scatter", t, fsdp::to_string(op), count,
                          in_place ? "in-place" : "out-of-place")};
          const std::size_t total = size * count;
          std::vector<char> send_h(total * es), recv_h(count * es, static_cast<char>(kSentinel));
          for (std::size_t j = 0; j < total; ++j) put(t, send_h, j, reduce_value(t, op, rank, j));
          Buffer send(mem, send_h.size()), sep(mem, in_place ? 0 : recv_h.size());
          char* recv = in_place ? send.get() + rank * count * es : sep.get();
          mem.upload(send.get(), send_h.data(), send_h.size());
          if (!in_place) mem.upload(recv, recv_h.data(), recv_h.size());
          if (in_place) {
            comm.reduce_scatter(send.get(), recv, count, t, op)->wait();
          } else {
            comm.reduce_scatter(send.get(), recv, count, t, op, comm.default_stream())->wait();
          }
          comm.default_stream().synchronize();
          mem.download(recv_h.data(), recv, recv_h.size());
          for (std::size_t i = 0; i < count; ++i) {
            c.wrong += !matches(t, op, size, get(t, recv_h, i),
                                expected_reduce(t, op, size, rank * count + i));
          }
          if (!in_place) {
            std::vector<char> after(send_h.size());
            mem.download(after.data(), send.get(), after.size());
            for (std::size_t j = 0; j < total; ++j) c.wrong += std::memcmp(&after[j * es], &send_h[j * es], es) != 0;
          }
          cases.push_back(c);
        }
      }
    }
  }
  expect_all_zero(comm, mem, cases);
}

inline void all_reduce(Communicator& comm, TestMemory& mem, bool large = true) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<Case> cases;
  for (DType t : kDTypes) {
    const std::size_t es = fsdp::dtype_size(t);
    for (ReduceOp op : ops_for(t)) {
      for (std::size_t count : counts_for(t, large)) {
        for (bool in_place : {false, true}) {
          Case c{describe("all_reduce", t, fsdp::to_string(op), count,
                          in_place ? "in-place" : "out-of-place")};
          std::vector<char> send_h(count * es), recv_h(count * es, static_cast<char>(kSentinel));
          for (std::size_t i = 0; i < count; ++i) put(t, send_h, i, reduce_value(t, op, rank, i));
          Buffer send(mem, send_h.size()), sep(mem, in_place ? 0 : recv_h.size());
          char* recv = in_place ? send.get() : sep.get();
          mem.upload(send.get(), send_h.data(), send_h.size());
          if (!in_place) mem.upload(recv, recv_h.data(), recv_h.size());
          if (in_place) {
            comm.all_reduce(send.get(), recv, count, t, op)->wait();
          } else {
            comm.all_reduce(send.get(), recv, count, t, op, comm.default_stream())->wait();
          }
          comm.default_stream().synchronize();
          mem.download(recv_h.data(), recv, recv_h.size());
          for (std::size_t i = 0; i < count; ++i) {
            c.wrong += !matches(t, op, size, get(t, recv_h, i), expected_reduce(t, op, size, i));
          }
          if (!in_place) {
            std::vector<char> after(send_h.size());
            mem.download(after.data(), send.get(), after.size());
            for (std::size_t i = 0; i < count; ++i) c.wrong += std::memcmp(&after[i * es], &send_h[i * es], es) != 0;
          }
          cases.push_back(c);
        }
      }
    }
  }
  expect_all_zero(comm, mem, cases);
}

inline void broadcast(Communicator& comm, TestMemory& mem, bool large = true) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<Case> cases;
  std::vector<int> roots = {0};
  if (size > 1) roots.push_back(size - 1);
  for (DType t : kDTypes) {
    const std::size_t es = fsdp::dtype_size(t);
    for (std::size_t count : counts_for(t, large)) {
      for (int root : roots) {
        Case c{describe("broadcast", t, "-", count, ("root=" + std::to_string(root)).c_str())};
        std::vector<char> h(count * es, static_cast<char>(kSentinel));
        if (rank == root) {
          for (std::size_t i = 0; i < count; ++i) put(t, h, i, gather_value(t, root, i));
        }
        Buffer buf(mem, h.size());
        mem.upload(buf.get(), h.data(), h.size());
        if (root == 0) {
          comm.broadcast(buf.get(), count, t, root)->wait();
        } else {
          comm.broadcast(buf.get(), count, t, root, comm.default_stream())->wait();
        }
        comm.default_stream().synchronize();
        mem.download(h.data(), buf.get(), h.size());
        for (std::size_t i = 0; i < count; ++i) c.wrong += get(t, h, i) != gather_value(t, root, i);
        cases.push_back(c);
      }
    }
  }
  expect_all_zero(comm, mem, cases);
}

// Work::done()->synchronize() completes the collective (avg division included), query()
// reports completion, and wait() afterwards changes nothing (the division happens once).
inline void work_done_event(Communicator& comm, TestMemory& mem) {
  const int rank = comm.rank(), size = comm.size();
  const std::size_t count = 1023;
  std::vector<Case> cases;
  for (DType t : {DType::f32, DType::bf16}) {
    const std::size_t es = fsdp::dtype_size(t);
    std::vector<char> h(count * es);
    for (std::size_t i = 0; i < count; ++i) put(t, h, i, reduce_value(t, ReduceOp::avg, rank, i));
    Buffer buf(mem, h.size());
    mem.upload(buf.get(), h.data(), h.size());
    auto work = comm.all_reduce(buf.get(), buf.get(), count, t, ReduceOp::avg);
    std::shared_ptr<fsdp::Event> done = work->done();
    done->synchronize();
    Case c{describe("all_reduce", t, "avg", count, "in-place, done()->synchronize() then wait() twice")};
    c.wrong += !done->query();
    for (int pass = 0; pass < 2; ++pass) {
      mem.download(h.data(), buf.get(), h.size());
      for (std::size_t i = 0; i < count; ++i) {
        c.wrong += !matches(t, ReduceOp::avg, size, get(t, h, i), expected_reduce(t, ReduceOp::avg, size, i));
      }
      work->wait();
      comm.default_stream().synchronize();
    }
    cases.push_back(c);
  }
  {  // polling query() until it reports completion
    const DType t = DType::i32;
    std::vector<char> send_h(count * 4), recv_h(size * count * 4);
    for (std::size_t i = 0; i < count; ++i) put(t, send_h, i, gather_value(t, rank, i));
    Buffer send(mem, send_h.size()), recv(mem, recv_h.size());
    mem.upload(send.get(), send_h.data(), send_h.size());
    auto work = comm.all_gather(send.get(), recv.get(), count, t);
    auto done = work->done();
    while (!done->query()) {
    }
    work.reset();  // the event outlives its Work
    done->synchronize();
    mem.download(recv_h.data(), recv.get(), recv_h.size());
    Case c{describe("all_gather", t, "-", count, "out-of-place, polling done()->query()")};
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < count; ++i) c.wrong += get(t, recv_h, r * count + i) != gather_value(t, r, i);
    }
    cases.push_back(c);
  }
  expect_all_zero(comm, mem, cases);
}

// A Work destroyed without wait() completes its collective, in any order of destruction.
inline void work_destructor_completes(Communicator& comm, TestMemory& mem) {
  const int rank = comm.rank(), size = comm.size();
  const std::size_t count = 1023;
  const DType t = DType::f32;
  std::vector<char> a_h(count * 4), g_h(count * 4), rs_h(size * count * 4);
  for (std::size_t i = 0; i < count; ++i) {
    put(t, a_h, i, reduce_value(t, ReduceOp::avg, rank, i));
    put(t, g_h, i, gather_value(t, rank, i));
  }
  for (std::size_t j = 0; j < size * count; ++j) put(t, rs_h, j, reduce_value(t, ReduceOp::sum, rank, j));
  Buffer a(mem, a_h.size()), g(mem, g_h.size()), gathered(mem, size * count * 4), rs(mem, rs_h.size());
  mem.upload(a.get(), a_h.data(), a_h.size());
  mem.upload(g.get(), g_h.data(), g_h.size());
  mem.upload(rs.get(), rs_h.data(), rs_h.size());
  {
    auto w1 = comm.all_reduce(a.get(), a.get(), count, t, ReduceOp::avg);
    auto w2 = comm.all_gather(g.get(), gathered.get(), count, t);
    auto w3 = comm.reduce_scatter(rs.get(), rs.get() + rank * count * 4, count, t, ReduceOp::sum);
    w2.reset();  // newest first, w1 last
    w3.reset();
  }
  comm.default_stream().synchronize();
  std::vector<Case> cases;
  Case c1{describe("all_reduce", t, "avg", count, "in-place, Work destroyed without wait()")};
  mem.download(a_h.data(), a.get(), a_h.size());
  for (std::size_t i = 0; i < count; ++i) {
    c1.wrong += !matches(t, ReduceOp::avg, size, get(t, a_h, i), expected_reduce(t, ReduceOp::avg, size, i));
  }
  cases.push_back(c1);
  Case c2{describe("all_gather", t, "-", count, "out-of-place, Work destroyed without wait()")};
  std::vector<char> out(size * count * 4);
  mem.download(out.data(), gathered.get(), out.size());
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < count; ++i) c2.wrong += get(t, out, r * count + i) != gather_value(t, r, i);
  }
  cases.push_back(c2);
  Case c3{describe("reduce_scatter", t, "sum", count, "in-place, Work destroyed without wait()")};
  mem.download(rs_h.data(), rs.get(), rs_h.size());
  for (std::size_t i = 0; i < count; ++i) {
    c3.wrong += get(t, rs_h, rank * count + i) != expected_reduce(t, ReduceOp::sum, size, rank * count + i);
  }
  cases.push_back(c3);
  expect_all_zero(comm, mem, cases);
}

// The cases with nothing to exchange (Communicator::local_impl): on `comm`, count 0 touches
// no buffer (recv keeps its sentinel) and its Work completes; on a group of one split from it,
// every collective out of place is recv = send (reduce_scatter and all_reduce with every op,
// avg included) with send untouched, in place leaves the data as it is, and broadcast leaves
// the buffer alone. Each Work's done() event completes after wait() and the stream's
// synchronize().
inline void trivial_cases(Communicator& comm, TestMemory& mem) {
  std::vector<Case> cases;
  const std::size_t n = 257;
  auto untouched = [&](const Buffer& b, std::size_t bytes) {
    std::vector<unsigned char> h(bytes);
    mem.download(h.data(), b.get(), bytes);
    return static_cast<int64_t>(std::count_if(h.begin(), h.end(), [](unsigned char c) { return c != kSentinel; }));
  };
  auto settle = [&](Communicator& c, std::unique_ptr<fsdp::Work> w, Case& k) {
    w->wait();
    c.default_stream().synchronize();
    k.wrong += !w->done()->query();
  };
  {  // count 0 on `comm`: recv (a real buffer here) keeps its sentinel
    const std::vector<unsigned char> fill(n * 4, kSentinel);
    Buffer send(mem, n * 4), recv(mem, n * 4);
    mem.upload(send.get(), fill.data(), fill.size());
    mem.upload(recv.get(), fill.data(), fill.size());
    Case c{"count 0 on the communicator: recv untouched, Work complete"};
    settle(comm, comm.all_gather(send.get(), recv.get(), 0, DType::f32), c);
    settle(comm, comm.reduce_scatter(send.get(), recv.get(), 0, DType::f32, ReduceOp::avg), c);
    settle(comm, comm.all_reduce(send.get(), recv.get(), 0, DType::i32, ReduceOp::max), c);
    settle(comm, comm.broadcast(recv.get(), 0, DType::u8, comm.size() - 1), c);
    c.wrong += untouched(recv, n * 4) + untouched(send, n * 4);
    cases.push_back(c);
  }
  {  // a group of one
    auto alone = comm.split(comm.rank(), 0);
    for (DType t : kDTypes) {
      const std::size_t es = fsdp::dtype_size(t);
      std::vector<char> send_h(n * es), out_h(n * es);
      for (std::size_t i = 0; i < n; ++i) put(t, send_h, i, gather_value(t, comm.rank(), i));
      auto expect_send = [&](const Buffer& b, Case& c) {
        mem.download(out_h.data(), b.get(), out_h.size());
        c.wrong += out_h != send_h;
      };
      std::vector<std::pair<std::string, std::function<std::unique_ptr<fsdp::Work>(const void*, void*)>>> calls = {
          {"all_gather", [&](const void* s, void* r) { return alone->all_gather(s, r, n, t); }},
          {"broadcast", [&](const void*, void* r) { return alone->broadcast(r, n, t, 0); }}};
      for (ReduceOp op : ops_for(t)) {
        calls.push_back({std::string("reduce_scatter ") + fsdp::to_string(op),
                         [&, op](const void* s, void* r) { return alone->reduce_scatter(s, r, n, t, op); }});
        calls.push_back({std::string("all_reduce ") + fsdp::to_string(op),
                         [&, op](const void* s, void* r) { return alone->all_reduce(s, r, n, t, op); }});
      }
      for (auto& [what, call] : calls) {
        Buffer send(mem, send_h.size()), recv(mem, send_h.size());
        mem.upload(send.get(), send_h.data(), send_h.size());
        Case c{describe(what.c_str(), t, "-", n, "group of one")};
        if (what != "broadcast") {  // out of place: recv = send, send untouched
          const std::vector<char> fill(send_h.size(), static_cast<char>(kSentinel));
          mem.upload(recv.get(), fill.data(), fill.size());
          settle(*alone, call(send.get(), recv.get()), c);
          expect_send(recv, c);
        }
        settle(*alone, call(send.get(), send.get()), c);  // in place (broadcast: its buffer)
        expect_send(send, c);
        cases.push_back(c);
      }
    }
  }
  expect_all_zero(comm, mem, cases);
}

// Sum over `comm` of one int32 per rank, through the communicator.
inline int32_t sum_over(Communicator& comm, TestMemory& mem, int32_t v) {
  Buffer d(mem, 4);
  mem.upload(d.get(), &v, 4);
  comm.all_reduce(d.get(), d.get(), 1, DType::i32, ReduceOp::sum)->wait();
  comm.default_stream().synchronize();
  mem.download(&v, d.get(), 4);
  return v;
}

// The opening checks every communicator shares (Communicator's public collectives): avg on an
// integer dtype and a broadcast root outside [0, size()) throw "<kind()>::<collective>: ..."
// on every rank, nothing is issued, and the communicator works afterwards.
inline void bad_arguments(Communicator& comm, TestMemory& mem) {
  const std::string kind = comm.kind();
  EXPECT_NE(kind, "Communicator") << "the implementation should name itself (kind())";
  Buffer d(mem, 4 * static_cast<std::size_t>(comm.size()));
  auto expect_error = [&](const std::function<void()>& call, const std::string& message) {
    try {
      call();
      ADD_FAILURE() << "no error; expected: " << message;
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  expect_error([&] { comm.all_reduce(d.get(), d.get(), 1, DType::i32, ReduceOp::avg); },
               kind + "::all_reduce: ReduceOp::avg needs a floating dtype, got " +
                   std::string(fsdp::to_string(DType::i32)));
  expect_error([&] { comm.reduce_scatter(d.get(), d.get(), 1, DType::u8, ReduceOp::avg); },
               kind + "::reduce_scatter: ReduceOp::avg needs a floating dtype, got " +
                   std::string(fsdp::to_string(DType::u8)));
  for (int root : {-1, comm.size()}) {
    expect_error([&] { comm.broadcast(d.get(), 1, DType::f32, root, comm.default_stream()); },
                 kind + "::broadcast: root " + std::to_string(root) +
                     " is not a rank of a communicator of size " + std::to_string(comm.size()));
  }
  EXPECT_EQ(sum_over(comm, mem, 1), comm.size()) << "the communicator after the refusals";
}

// split(color, key) and split_node(): sizes, ranks, and working collectives on the result.
inline void split(Communicator& comm, TestMemory& mem) {
  const int rank = comm.rank(), size = comm.size();
  {
    auto parity = comm.split(rank % 2, rank);
    EXPECT_EQ(parity->size(), (size - rank % 2 + 1) / 2);
    EXPECT_EQ(parity->rank(), rank / 2);
    int32_t want = 0;
    for (int r = rank % 2; r < size; r += 2) want += r;
    EXPECT_EQ(sum_over(*parity, mem, rank), want) << "sum of world ranks over the parity group";
  }
  {
    auto reversed = comm.split(0, -rank);  // ordered by key: ranks reversed
    EXPECT_EQ(reversed->size(), size);
    EXPECT_EQ(reversed->rank(), size - 1 - rank);
  }
  {
    auto alone = comm.split(rank, 0);
    EXPECT_EQ(alone->size(), 1);
    EXPECT_EQ(alone->rank(), 0);
    EXPECT_EQ(sum_over(*alone, mem, rank + 1), rank + 1);
  }
  {
    auto node = comm.split_node();
    EXPECT_GE(node->size(), 1);
    EXPECT_LE(node->size(), size);
    EXPECT_GE(node->rank(), 0);
    EXPECT_LT(node->rank(), node->size());
    EXPECT_EQ(sum_over(*node, mem, 1), node->size());
    // Nodes partition the world: the node sizes counted once (by each node's rank 0) add up.
    EXPECT_EQ(sum_over(comm, mem, node->rank() == 0 ? node->size() : 0), size);
  }
}

// DeviceMesh over `comm`: shard sizes 1, 2, size and the node; a bad one throws InputError.
inline void device_mesh(Communicator& comm, TestMemory& mem) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<int64_t> shard_sizes = {1, size, 0};
  if (size % 2 == 0) shard_sizes.push_back(2);
  for (int64_t s : shard_sizes) {
    SCOPED_TRACE("shard_size " + std::to_string(s));
    fsdp::DeviceMesh mesh = fsdp::DeviceMesh::create(comm, s);
    const int shard = s > 0 ? static_cast<int>(s) : mesh.local_size();
    EXPECT_EQ(mesh.world_size(), size);
    EXPECT_EQ(mesh.world_rank(), rank);
    EXPECT_EQ(mesh.shard_size(), shard);
    EXPECT_EQ(mesh.replicate_size(), size / shard);
    EXPECT_GE(mesh.local_size(), 1);
    EXPECT_EQ(mesh.self().size(), 1);
    EXPECT_EQ(mesh.self().rank(), 0);
    EXPECT_EQ(mesh.describe(), "world " + std::to_string(size) + " = replicate " +
                                   std::to_string(size / shard) + " x shard " + std::to_string(shard));
    if (s > 0) {
      EXPECT_EQ(mesh.shard_rank(), rank % shard);
      EXPECT_EQ(mesh.replicate_rank(), rank / shard);
      int32_t shard_sum = 0, replicate_sum = 0;
      for (int r = 0; r < size; ++r) {
        if (r / shard == rank / shard) shard_sum += r;
        if (r % shard == rank % shard) replicate_sum += r;
      }
      EXPECT_EQ(sum_over(mesh.shard_group(), mem, rank), shard_sum);
      EXPECT_EQ(sum_over(mesh.replicate_group(), mem, rank), replicate_sum);
    } else {
      EXPECT_EQ(mesh.shard_rank(), mesh.local_rank());
      EXPECT_EQ(sum_over(mesh.shard_group(), mem, 1), mesh.local_size());
    }
    EXPECT_EQ(sum_over(mesh.world(), mem, rank), size * (size - 1) / 2);
    EXPECT_EQ(sum_over(mesh.self(), mem, rank), rank);
  }
  // size + 1 never divides size: every rank throws the same InputError.
  try {
    fsdp::DeviceMesh::create(comm, size + 1);
    ADD_FAILURE() << "DeviceMesh::create(shard_size " << size + 1 << ") did not throw";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
    EXPECT_EQ(std::string(e.what()), "mesh.shard_size: " + std::to_string(size + 1) +
                                         " does not divide the world size " + std::to_string(size));
  }
  EXPECT_EQ(sum_over(comm, mem, 1), size) << "communicator usable after the InputError";
}

// DeviceMesh::map over meshes built on the host communicator `host` (shard sizes 1, size,
// the node, and 2 when size is even): the mapped mesh has the same ranks, sizes, local rank
// and description, and its groups' collectives (buffers in `mem`) sum over the right ranks.
inline void mesh_map(Communicator& host, TestMemory& mem, const fsdp::DeviceMesh::MakeCommunicator& make) {
  const int rank = host.rank(), size = host.size();
  std::vector<int64_t> shard_sizes = {1, size, 0};
  if (size % 2 == 0) shard_sizes.push_back(2);
  for (int64_t s : shard_sizes) {
    SCOPED_TRACE("shard_size " + std::to_string(s));
    const fsdp::DeviceMesh mesh = fsdp::DeviceMesh::create(host, s);
    const fsdp::DeviceMesh mapped = mesh.map(make);
    EXPECT_EQ(mapped.world_rank(), mesh.world_rank());
    EXPECT_EQ(mapped.world_size(), mesh.world_size());
    EXPECT_EQ(mapped.shard_rank(), mesh.shard_rank());
    EXPECT_EQ(mapped.shard_size(), mesh.shard_size());
    EXPECT_EQ(mapped.replicate_rank(), mesh.replicate_rank());
    EXPECT_EQ(mapped.replicate_size(), mesh.replicate_size());
    EXPECT_EQ(mapped.local_rank(), mesh.local_rank());
    EXPECT_EQ(mapped.local_size(), mesh.local_size());
    EXPECT_EQ(mapped.describe(), mesh.describe());
    EXPECT_EQ(mapped.self().size(), 1);
    // Sums of world ranks over each group, through the mapped communicators, against the
    // host mesh's own.
    int32_t shard_sum = rank, replicate_sum = rank;
    mesh.shard_group().all_reduce(&shard_sum, &shard_sum, 1, DType::i32, ReduceOp::sum)->wait();
    mesh.replicate_group().all_reduce(&replicate_sum, &replicate_sum, 1, DType::i32, ReduceOp::sum)->wait();
    EXPECT_EQ(sum_over(mapped.shard_group(), mem, rank), shard_sum);
    EXPECT_EQ(sum_over(mapped.replicate_group(), mem, rank), replicate_sum);
    EXPECT_EQ(sum_over(mapped.world(), mem, rank), size * (size - 1) / 2);
    EXPECT_EQ(sum_over(mapped.self(), mem, rank), rank);
  }
  // A make that returns a communicator of the wrong group throws, naming the group.
  try {
    (void)fsdp::DeviceMesh::create(host, size).map([&](Communicator& g) { return g.split(g.rank(), 0); });
    if (size > 1) ADD_FAILURE() << "DeviceMesh::map accepted a communicator of the wrong size";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("DeviceMesh::map: the communicator made for the world group"),
              std::string::npos) << e.what();
  }
}

}  // namespace conformance
