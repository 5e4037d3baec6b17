// A CPU emulator of the CUDA subset acpo's kernels use, so that the kernels of kernels/ (their
// tensor-core paths included) are checked on a machine without a GPU: CI, and every session
// that was not lent one. kernels/check/*.cu built with `g++ -DACPO_EMU` run here what
// `nvcc` runs on a GPU; tests/it/kernels.rs does that in `cargo test`.
//
// What it models, and how:
// - A block's threads are cooperative contexts (ucontext) on one OS thread. One block runs at a
//   time, so `__shared__` is a function-level static (one copy, shared by the block's threads).
//   The threads run in an order drawn from a seed at every block, and each runs until it
//   reaches a barrier or a warp collective. In the schedules that lag (S.schedule & 1), one warp
//   of each block runs only when every other thread waits: the others race ahead to the next
//   barrier, so a kernel that overwrites shared memory a slower warp still reads, or reads what
//   a slower warp has not written (a missing __syncthreads), computes a wrong result.
// - Warp collectives (shuffles, ldmatrix, mma.sync, __syncwarp): every live lane of the warp
//   deposits its operands; the last to arrive computes every lane's result.
// - mma.sync.m16n8k16 (bf16 in, f32 accumulate) and ldmatrix (.x1/.x2/.x4, .trans) by the PTX
//   ISA's fragment layouts. The accumulation adds the 16 products to C in k order in f32; a
//   tensor core adds them in its own order: results agree to f32 rounding, not bit for bit.
// - cp.async: a copy lands when cp.async.wait_group retires its group (or the thread exits), or,
//   in the schedules that land early (S.schedule & 2), when it is issued: a kernel that reads a
//   stage before waiting for it reads stale data in the first, and one that reloads a stage
//   before every warp is done with it corrupts a slower warp's operands in the second.
// - Device memory is host memory; launches run to completion (no streams, no events).
// - Blocks that wait on one another (issue #59: a deterministic cross-block accumulation, each
//   block adding its share after the ones before it, `block_wait_count` / `block_post_count` in
//   common.cuh): with `S.resident` above 1 (a check sets it for such a launch, `use_residency`
//   in harness.hpp), blocks are issued in grid order (x fastest) and up to that many are
//   resident at once, each with its own threads and dynamic shared memory; one thread of a
//   drawn resident block runs at a time, to its next barrier, collective or flag wait, so the
//   blocks interleave at every such point and a thread's flag wait holds it until the flag has
//   its value. A block that adds before the ones it should wait for (a missing wait, a post
//   before the block's other threads are done) then adds in another order, which a check of the
//   result's bits sees; a wait no block will satisfy stops with a deadlock naming every
//   resident block's wait. Such kernels keep to dynamic shared memory: a static __shared__ is one
//   copy here, shared by the resident blocks.
//
// What it refuses, as hardware does (each stops the program with a message naming the block,
// the thread and the fault; exit status 3):
// - a barrier reached by part of a block: threads waiting at different __syncthreads sites, a
//   thread returning while others wait at a barrier, or a barrier after some threads returned
//   (undefined on a GPU: it hangs or passes early);
// - a warp collective some live lanes never reach, or one a lane left by returning;
// - cp.async of other than 4, 8 or 16 bytes, or from or to an address not aligned to its size;
//   ldmatrix row addresses not 16-byte aligned;
// - dynamic shared memory above the 48 KB default without the kernel's limit raised first
//   (cudaFuncSetAttribute, `set_max_dynamic_smem` here: the launch macros of the checks do it
//   as a GPU launch must), or above the H100's 227 KB per block; a block of more than 1024
//   threads, a grid beyond its dimensions' limits;
// - out-of-bounds global and dynamic shared memory accesses: every emulated device allocation
//   (`device_alloc`) and each block's dynamic shared memory ends at a page with no access
//   rights (mprotect), so an access past the end faults, and the SIGSEGV handler names the
//   allocation, how far past its end the access fell, and the block and thread. Allocations are
//   16-byte aligned, so an access into the few bytes between an odd-sized allocation's end and
//   the guard page is not caught; those bytes hold 0xFF (NaN in f32 and bf16), so a read of
//   them poisons a result, and a write is caught by the check after each launch.
// - Built with -fsanitize=address (the tests do both builds), allocations are AddressSanitizer's
//   instead, exact to the byte, and static __shared__ arrays get its redzones too: an overflow
//   of one is reported as a global-buffer-overflow (the threads' stack switches are annotated
//   for it).
//
// What it does not model: timing, occupancy, bank conflicts, register limits, static shared
// memory's share of the 227 KB, memory ordering across blocks (every write is seen at once by
// every block: a missing __threadfence passes here, which is why the fence lives inside
// `block_post_count` rather than in the kernels), or any instruction not defined here (a kernel
// using one fails to compile here rather than run wrongly).
#pragma once
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#include <sanitizer/common_interface_defs.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

#include "../launch.cuh"  // the shared memory limits (SMEM_DEFAULT_LIMIT, SMEM_OPT_IN_LIMIT)

using std::max;
using std::min;

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint2 {
  unsigned x, y;
};
struct uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// bf16 as CUDA stores it: the high half of an f32, rounded to nearest even.
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fc0};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(uint16_t)(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
// The round-to-nearest intrinsics are IEEE f32 operations, which the host's are when it does not
// contract a product and a sum (g++ -std=c++17 does not: -ffp-contract=off in ISO mode).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }

namespace emu {

struct Copy {
  void* dst;
  const void* src;
  int bytes;   // bytes read from src
  int fill;    // bytes written (the rest zero-filled)
};

struct Thread {
  ucontext_t ctx;
  dim3 idx;
  bool done = false;
  // what the thread waits for: 0 nothing, 1 the block barrier, 2 its warp's collective, 3 a
  // flag in global memory to equal `want`
  int waits = 0;
  unsigned wait_gen = 0;
  const volatile int* flag = nullptr;
  int want = 0;
  std::vector<std::vector<Copy>> groups{std::vector<Copy>()};  // cp.async groups, last open
};

// One warp collective's operands and results per lane, double-buffered by generation parity:
// a lane that leaves collective g and enters g + 1 writes the other buffer, so lanes still
// reading g's results see them.
struct Warp {
  int arrived = 0;
  unsigned gen = 0;
  uint64_t in[2][32][12];
  uint32_t out[2][32][4];
};

// An emulated device allocation (or a block's dynamic shared memory): `bytes` at `base`, in a
// mapping whose first and last pages have no access rights; `base + bytes` lies at most 15
// bytes before the last page.
struct Region {
  char* map;
  size_t map_len;
  char* base;
  size_t bytes;
  const char* what;
};

struct State {
  dim3 grid, block, bidx;
  int cur = -1, n = 0, live = 0;
  std::vector<Thread> th;
  std::vector<Warp> warps;
  std::vector<char> stacks;
  ucontext_t sched;
  int arrived = 0;
  unsigned barrier_gen = 0;
  // the __syncthreads site the waiting threads reached
  const char* bar_file = nullptr;
  int bar_line = 0;
  unsigned char* dyn = nullptr;
  size_t dyn_bytes = 0;
  const char* kernel = "";
  const std::function<void()>* body = nullptr;
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  // bit 0: one warp per block lags; bit 1: cp.async copies land when issued
  int schedule = 0;
  int lag = -1;  // the lagging warp of the block that runs
  // the block's thread order (drawn), and where a resident block's next thread is looked for
  std::vector<int> order;
  size_t cursor = 0;
  // blocks of a launch resident at once: 1 runs each block to its end before the next
  int resident = 1;
  std::vector<Region> regions;
  std::vector<std::pair<const void*, size_t>> smem_limits;  // cudaFuncSetAttribute per kernel
#ifdef EMU_ASAN
  const void* sched_stack = nullptr;
  size_t sched_stack_size = 0;
#endif
};
inline State S;
#ifdef EMU_ASAN
// AddressSanitizer's swapcontext clears the shadow of the whole stack it switches to: a small
// stack keeps that cheap
inline constexpr size_t STACK = 64 * 1024;
#else
inline constexpr size_t STACK = 256 * 1024;
#endif
inline constexpr size_t ALIGN = 16;
inline constexpr unsigned char SLACK = 0xFF;

// Where the program is: the kernel, block and thread, for a fault's message.
inline int where(char* buf, size_t n) {
  if (S.cur < 0)
    return *S.kernel ? std::snprintf(buf, n, "at the launch of %s", S.kernel)
                     : std::snprintf(buf, n, "outside a kernel");
  const dim3 t = S.th[S.cur].idx;
  return std::snprintf(buf, n, "in %s, block (%u, %u, %u), thread (%u, %u, %u)", S.kernel,
                       S.bidx.x, S.bidx.y, S.bidx.z, t.x, t.y, t.z);
}

[[noreturn]] inline void fail(const char* what) {
  char at[256];
  where(at, sizeof at);
  std::fflush(stdout);
  std::fprintf(stderr, "cuda_emu: %s (%s)\n", what, at);
  std::fflush(stderr);
  _exit(3);
}

template <typename... A>
[[noreturn]] inline void failf(const char* fmt, A... args) {
  char msg[512];
  std::snprintf(msg, sizeof msg, fmt, args...);
  fail(msg);
}

// ---- memory

inline size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

// The SIGSEGV handler: a fault in a guard page names the allocation it borders.
inline void on_segv(int, siginfo_t* info, void* uc) {
  const char* addr = (const char*)info->si_addr;
  const char* access = "access";
#if defined(__x86_64__)
  access = (((ucontext_t*)uc)->uc_mcontext.gregs[REG_ERR] & 2) ? "write" : "read";
#else
  (void)uc;
#endif
  char msg[512];
  int len = std::snprintf(msg, sizeof msg, "cuda_emu: a segmentation fault at %p", (void*)addr);
  for (const Region& r : S.regions) {
    const size_t page = page_size();
    if (addr >= r.map && addr < r.map + page) {
      len = std::snprintf(msg, sizeof msg,
                          "cuda_emu: an out-of-bounds %s %zu bytes before the start of %s of "
                          "%zu bytes",
                          access, (size_t)(r.base - addr), r.what, r.bytes);
      break;
    }
    if (addr >= r.map + r.map_len - page && addr < r.map + r.map_len) {
      len = std::snprintf(msg, sizeof msg,
                          "cuda_emu: an out-of-bounds %s %zu bytes past the end of %s of %zu "
                          "bytes",
                          access, (size_t)(addr - (r.base + r.bytes)), r.what, r.bytes);
      break;
    }
  }
  len += std::snprintf(msg + len, sizeof msg - len, " (");
  len += where(msg + len, sizeof msg - len);
  len += std::snprintf(msg + len, sizeof msg - len, ")\n");
  std::fflush(stdout);
  if (write(2, msg, (size_t)len) < 0) _exit(4);
  _exit(3);
}

inline void install_segv_handler() {
  static bool done = false;
  if (done) return;
  done = true;
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

// `bytes` of emulated device memory (or dynamic shared memory: `what` names it in a fault),
// 16-byte aligned, ending as close to a guard page as that alignment allows.
inline void* region_alloc(size_t bytes, const char* what) {
#ifdef EMU_ASAN
  (void)what;
  void* p = std::malloc(bytes ? bytes : 1);  // 16-byte aligned, redzones exact to the byte
  if (!p) fail("out of host memory");
  return p;
#else
  install_segv_handler();
  const size_t page = page_size();
  const size_t body = std::max(page, (bytes + ALIGN + page - 1) / page * page);
  const size_t len = body + 2 * page;
  char* map = (char*)mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) fail("out of host memory");
  if (mprotect(map, page, PROT_NONE) != 0 || mprotect(map + page + body, page, PROT_NONE) != 0)
    fail("mprotect failed");
  char* end = map + page + body;
  char* base = (char*)((uintptr_t)(end - bytes) & ~(uintptr_t)(ALIGN - 1));
  std::memset(map + page, SLACK, body);
  S.regions.push_back({map, len, base, bytes, what});
  return base;
#endif
}

inline void region_free(void* p) {
#ifdef EMU_ASAN
  std::free(p);
#else
  for (size_t i = 0; i < S.regions.size(); ++i)
    if (S.regions[i].base == p) {
      munmap(S.regions[i].map, S.regions[i].map_len);
      S.regions.erase(S.regions.begin() + i);
      return;
    }
  fail("freeing memory that device_alloc did not allocate");
#endif
}

// The bytes between an allocation's end and its guard page still hold SLACK: no write fell
// there.
inline void check_slack() {
#ifndef EMU_ASAN
  const size_t page = page_size();
  for (const Region& r : S.regions) {
    const char* end = r.map + r.map_len - page;
    for (const char* c = r.base + r.bytes; c < end; ++c)
      if ((unsigned char)*c != SLACK)
        failf("an out-of-bounds write %zu bytes past the end of %s of %zu bytes (in %s)",
              (size_t)(c - (r.base + r.bytes)), r.what, r.bytes, S.kernel);
  }
#endif
}

inline void* device_alloc(size_t bytes) { return region_alloc(bytes, "a device allocation"); }
inline void device_free(void* p) { region_free(p); }

// ---- threads

inline Thread& me() { return S.th[S.cur]; }
inline int lane() { return S.cur & 31; }
inline int live_lanes(int w) {
  int n = 0;
  for (int l = 0; l < 32 && w * 32 + l < S.n; ++l) n += !S.th[w * 32 + l].done;
  return n;
}

// Context switches, annotated for AddressSanitizer (which otherwise takes a switch of stacks
// for a stack overflow).
inline void to_scheduler(Thread& t, bool dying) {
#ifdef EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, S.sched_stack, S.sched_stack_size);
  swapcontext(&t.ctx, &S.sched);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)dying;
  swapcontext(&t.ctx, &S.sched);
#endif
}
inline void to_thread(int i) {
#ifdef EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, S.stacks.data() + (size_t)i * STACK, STACK);
  swapcontext(&S.sched, &S.th[i].ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  swapcontext(&S.sched, &S.th[i].ctx);
#endif
}
inline void yield() { to_scheduler(me(), false); }

inline void land(const std::vector<Copy>& group) {
  for (const Copy& c : group) {
    std::memcpy(c.dst, c.src, c.bytes);
    std::memset((char*)c.dst + c.bytes, 0, c.fill - c.bytes);
  }
}
// cp.async.wait_group keep: the committed groups (all but the open last one) land, oldest
// first, until at most `keep` are pending.
inline void retire_groups(Thread& t, size_t keep) {
  while (t.groups.size() - 1 > keep) {
    land(t.groups.front());
    t.groups.erase(t.groups.begin());
  }
}

// __syncthreads at file:line. Every thread of the block must reach the same barrier: a site
// other than the one the waiting threads reached, or a block some threads have left, is
// refused.
inline void barrier(const char* file, int line) {
  Thread& t = me();
  if (S.live != S.n)
    failf("__syncthreads at %s:%d reached by part of a block: %d of its %d threads have "
          "returned",
          file, line, S.n - S.live, S.n);
  if (S.arrived == 0) {
    S.bar_file = file;
    S.bar_line = line;
  } else if (S.bar_line != line || std::strcmp(S.bar_file, file) != 0) {
    failf("a divergent barrier: this thread reached __syncthreads at %s:%d while %d others "
          "wait at %s:%d",
          file, line, S.arrived, S.bar_file, S.bar_line);
  }
  if (++S.arrived == S.live) {
    S.arrived = 0;
    ++S.barrier_gen;
    return;
  }
  t.waits = 1;
  t.wait_gen = S.barrier_gen;
  yield();
}

// The collective: this lane's operands in, this lane's results out; `op(in, out)` runs once,
// on the last lane to arrive, over every lane's operands.
template <typename Op>
inline void collective(const uint64_t* in, int n_in, uint32_t* out, int n_out, Op op) {
  Thread& t = me();
  Warp& w = S.warps[S.cur >> 5];
  const int p = w.gen & 1;
  std::memcpy(w.in[p][lane()], in, n_in * sizeof(uint64_t));
  if (++w.arrived == live_lanes(S.cur >> 5)) {
    if (live_lanes(S.cur >> 5) != std::min(32, S.n - (S.cur & ~31)))
      fail("a warp collective with lanes that have returned (undefined on a GPU)");
    op(w.in[p], w.out[p]);
    w.arrived = 0;
    ++w.gen;
  } else {
    t.waits = 2;
    t.wait_gen = w.gen;
    yield();
  }
  std::memcpy(out, w.out[p][lane()], n_out * sizeof(uint32_t));
}

inline bool runnable(const Thread& t) {
  if (t.done) return false;
  if (t.waits == 1) return S.barrier_gen != t.wait_gen;
  if (t.waits == 2) return S.warps[(&t - S.th.data()) >> 5].gen != t.wait_gen;
  if (t.waits == 3) return *t.flag == t.want;
  return true;
}

inline void entry() {
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &S.sched_stack, &S.sched_stack_size);
#endif
  (*S.body)();
  Thread& t = me();
  for (const auto& g : t.groups) land(g);  // an exiting thread's copies still land
  t.done = true;
  --S.live;
  Warp& w = S.warps[S.cur >> 5];
  if (w.arrived > 0) fail("a lane returned while its warp waits in a collective");
  if (S.arrived > 0)
    failf("a thread returned while %d others wait at __syncthreads at %s:%d (a barrier "
          "reached by part of a block)",
          S.arrived, S.bar_file, S.bar_line);
  to_scheduler(t, true);
}

inline uint64_t next_rand() {
  S.rng ^= S.rng << 13;
  S.rng ^= S.rng >> 7;
  S.rng ^= S.rng << 17;
  return S.rng;
}

// Sets up the threads of block S.bidx: their contexts, the order they run in and the lagging
// warp, drawn from the schedule's seed.
inline void start_block() {
  const int n = S.n;
  if (S.stacks.size() < (size_t)n * STACK) S.stacks.resize((size_t)n * STACK);
  S.th.assign(n, Thread());
  S.warps.assign((n + 31) / 32, Warp());
  S.live = n;
  S.arrived = 0;
  for (int i = 0; i < n; ++i) {
    Thread& t = S.th[i];
    t.idx = dim3(i % S.block.x, (i / S.block.x) % S.block.y, i / (S.block.x * S.block.y));
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = S.stacks.data() + (size_t)i * STACK;
    t.ctx.uc_stack.ss_size = STACK;
    t.ctx.uc_link = nullptr;
    makecontext(&t.ctx, entry, 0);
  }
  S.order.resize(n);
  for (int i = 0; i < n; ++i) S.order[i] = i;
  for (int i = n - 1; i > 0; --i) std::swap(S.order[i], S.order[next_rand() % (i + 1)]);
  S.lag = (S.schedule & 1) ? (int)(next_rand() % ((n + 31) / 32)) : -1;
  S.cursor = 0;
}

inline void run_thread(int i) {
  Thread& t = S.th[i];
  t.waits = 0;
  S.cur = i;
  to_thread(i);
  S.cur = -1;
}

// Every runnable thread of the block once, in its order; the lagging warp only when no other
// thread can run. Whether any ran.
inline bool run_round() {
  auto run = [&](bool lagging) {
    bool progress = false;
    for (int i : S.order) {
      if ((i >> 5 == S.lag) != lagging || !runnable(S.th[i])) continue;
      run_thread(i);
      progress = true;
    }
    return progress;
  };
  return run(false) || run(true);
}

// One runnable thread of a resident block, the next in its order after the last one that ran
// (the lagging warp only when no other thread can run). Whether one ran.
inline bool run_one() {
  const size_t n = S.order.size();
  for (int lagging = 0; lagging < 2; ++lagging)
    for (size_t k = 0; k < n; ++k) {
      const size_t at = (S.cursor + k) % n;
      const int i = S.order[at];
      if ((i >> 5 == S.lag) != (lagging == 1) || !runnable(S.th[i])) continue;
      S.cursor = at + 1;
      run_thread(i);
      return true;
    }
  return false;
}

// What the block's waiting threads wait for, for a deadlock's message.
inline void describe_waits(char* buf, size_t len) {
  int at_flag = -1, others = 0;
  for (int i = 0; i < S.n; ++i) {
    const Thread& t = S.th[i];
    if (t.done) continue;
    if (t.waits == 3 && at_flag < 0)
      at_flag = i;
    else
      ++others;
  }
  if (at_flag >= 0) {
    const Thread& t = S.th[at_flag];
    std::snprintf(buf, len,
                  "block (%u, %u, %u): thread %d waits for the flag at %p to equal %d (it holds "
                  "%d), %d other threads wait",
                  S.bidx.x, S.bidx.y, S.bidx.z, at_flag, (const void*)t.flag, t.want, *t.flag,
                  others);
  } else {
    std::snprintf(buf, len, "block (%u, %u, %u): %d threads wait at a barrier or collective",
                  S.bidx.x, S.bidx.y, S.bidx.z, others);
  }
}

inline void run_block() {
  start_block();
  while (S.live > 0)
    if (!run_round()) {
      char what[256];
      describe_waits(what, sizeof what);
      failf("deadlock: threads wait at a barrier, collective or flag that nothing will reach "
            "or set (%s)",
            what);
    }
}

// A resident block's own state, kept here while another block's is in S.
struct Block {
  dim3 bidx;
  std::vector<Thread> th;
  std::vector<Warp> warps;
  std::vector<char> stacks;
  std::vector<int> order;
  size_t cursor = 0;
  int live = 0, arrived = 0, lag = -1;
  unsigned barrier_gen = 0;
  const char* bar_file = nullptr;
  int bar_line = 0;
  unsigned char* dyn = nullptr;
};

// Exchanges the block in S with `b` (vectors swap their buffers: the threads' contexts and
// stacks stay where they are).
inline void swap_block(Block& b) {
  std::swap(S.bidx, b.bidx);
  std::swap(S.th, b.th);
  std::swap(S.warps, b.warps);
  std::swap(S.stacks, b.stacks);
  std::swap(S.order, b.order);
  std::swap(S.cursor, b.cursor);
  std::swap(S.live, b.live);
  std::swap(S.arrived, b.arrived);
  std::swap(S.lag, b.lag);
  std::swap(S.barrier_gen, b.barrier_gen);
  std::swap(S.bar_file, b.bar_file);
  std::swap(S.bar_line, b.bar_line);
  std::swap(S.dyn, b.dyn);
}

// The grid's blocks with up to S.resident at once (see the top of this file): issued in grid
// order, x fastest; each step runs one thread of a drawn resident block that can run.
inline void run_resident(size_t dyn_bytes) {
  const unsigned gx = S.grid.x, gy = S.grid.y;
  const uint64_t total = (uint64_t)gx * gy * S.grid.z;
  uint64_t next = 0;
  std::vector<Block> res;
  std::vector<std::vector<char>> spare;  // stacks of finished blocks, for the next ones
  spare.push_back(std::move(S.stacks));
  while (next < total || !res.empty()) {
    while ((int)res.size() < S.resident && next < total) {
      Block b;
      b.bidx = dim3((unsigned)(next % gx), (unsigned)(next / gx % gy), (unsigned)(next / gx / gy));
      ++next;
      b.dyn = (unsigned char*)region_alloc(dyn_bytes, "the block's dynamic shared memory");
      std::memset(b.dyn, 0xA5, dyn_bytes);
      if (!spare.empty()) {
        b.stacks = std::move(spare.back());
        spare.pop_back();
      }
      swap_block(b);
      start_block();
      swap_block(b);
      res.push_back(std::move(b));
    }
    const size_t first = next_rand() % res.size();
    bool ran = false;
    for (size_t k = 0; k < res.size() && !ran; ++k) {
      const size_t i = (first + k) % res.size();
      swap_block(res[i]);
      ran = run_one();
      const bool done = S.live == 0;
      swap_block(res[i]);
      if (done) {
        check_slack();
        region_free(res[i].dyn);
        spare.push_back(std::move(res[i].stacks));
        res.erase(res.begin() + (long)i);
      }
    }
    if (!ran) {
      char msg[1024];
      int len = std::snprintf(msg, sizeof msg,
                              "deadlock: every resident block waits (%zu resident, %llu of %llu "
                              "blocks issued)",
                              res.size(), (unsigned long long)next, (unsigned long long)total);
      for (Block& b : res) {
        swap_block(b);
        char what[256];
        describe_waits(what, sizeof what);
        swap_block(b);
        if (len < (int)sizeof msg)
          len += std::snprintf(msg + len, sizeof msg - len, "; %s", what);
      }
      fail(msg);
    }
  }
  S.stacks = spare.empty() ? std::vector<char>() : std::move(spare.back());
}

// A thread's wait until the flag at `flag` equals `want` (block_wait_count in common.cuh): the
// thread holds until some block sets it; with one block resident, a flag not already set is a
// deadlock.
inline void wait_flag(const volatile int* flag, int want) {
  if (*flag == want) return;
  Thread& t = me();
  t.waits = 3;
  t.flag = flag;
  t.want = want;
  yield();
}

inline unsigned char* dynamic_smem() { return S.dyn; }

// cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
inline void set_max_dynamic_smem(const void* f, size_t bytes) {
  if (bytes > SMEM_OPT_IN_LIMIT)
    failf("cudaFuncSetAttribute: %zu bytes of dynamic shared memory, above the H100's %d per "
          "block",
          bytes, SMEM_OPT_IN_LIMIT);
  for (auto& a : S.smem_limits)
    if (a.first == f) {
      a.second = bytes;
      return;
    }
  S.smem_limits.push_back({f, bytes});
}

inline size_t max_dynamic_smem(const void* f) {
  for (const auto& a : S.smem_limits)
    if (a.first == f) return std::max(a.second, (size_t)SMEM_DEFAULT_LIMIT);
  return SMEM_DEFAULT_LIMIT;
}

// Runs `body` (the call of kernel `f`, named `name`) for every thread of every block, blocks
// in order (S.resident of them interleaving when above 1), after the checks a GPU's launch
// makes.
inline void launch(const void* f, const char* name, dim3 grid, dim3 block, size_t dyn_bytes,
                   const std::function<void()>& body) {
  S.kernel = name;
  S.grid = grid;
  S.block = block;
  S.n = block.x * block.y * block.z;
  if (S.n <= 0 || S.n > 1024 || block.z > 64)
    failf("a block of %u x %u x %u threads (at most 1024, z at most 64)", block.x, block.y,
          block.z);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 0x7fffffffu)
    failf("a grid of %u x %u x %u blocks (y and z at most 65535, none empty)", grid.x, grid.y,
          grid.z);
  if (dyn_bytes > SMEM_OPT_IN_LIMIT)
    failf("a launch with %zu bytes of dynamic shared memory, above the H100's %d per block",
          dyn_bytes, SMEM_OPT_IN_LIMIT);
  if (dyn_bytes > max_dynamic_smem(f))
    failf("a launch with %zu bytes of dynamic shared memory, above the %zu the kernel allows "
          "(raise it with cudaFuncSetAttribute(MaxDynamicSharedMemorySize) first)",
          dyn_bytes, max_dynamic_smem(f));
  S.dyn_bytes = dyn_bytes;
  S.body = &body;
  if (S.resident > 1) {
    run_resident(dyn_bytes);
    check_slack();
    S.kernel = "";
    return;
  }
  S.dyn = (unsigned char*)region_alloc(dyn_bytes, "the block's dynamic shared memory");
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        S.bidx = dim3(x, y, z);
        // poisoned at every block (blocks of a GPU never share it): a kernel must write what
        // it reads
        std::memset(S.dyn, 0xA5, dyn_bytes);
        run_block();
      }
  check_slack();
  region_free(S.dyn);
  S.dyn = nullptr;
  S.kernel = "";
}

// ---- warp primitives

template <typename T>
inline T shfl(T v, int src, bool xor_mode) {
  static_assert(sizeof(T) <= 8, "a shuffle moves up to 8 bytes");
  uint64_t in[2] = {0, (uint64_t)(unsigned)src | (xor_mode ? 1ull << 32 : 0)};
  std::memcpy(&in[0], &v, sizeof(T));
  uint32_t out[2];
  collective(in, 2, out, 2, [](uint64_t (*i)[12], uint32_t (*o)[4]) {
    for (int l = 0; l < 32; ++l) {
      const int arg = (int)(i[l][1] & 0xffffffffu);
      const int from = (i[l][1] >> 32) ? (l ^ arg) & 31 : arg & 31;
      std::memcpy(o[l], &i[from][0], 8);
    }
  });
  T r;
  std::memcpy(&r, out, sizeof(T));
  return r;
}

inline void syncwarp() {
  uint64_t in[1] = {0};
  uint32_t out[1];
  collective(in, 1, out, 0, [](uint64_t (*)[12], uint32_t (*)[4]) {});
}

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16: lanes 8i..8i+7 give the row
// addresses of matrix i, each 16-byte aligned; lane t receives, of each matrix, row t/4,
// columns 2(t%4) and 2(t%4)+1 (with .trans: rows 2(t%4) and 2(t%4)+1 of column t/4).
inline void ldmatrix(uint32_t* r, int num, bool trans, const void* row) {
  uint64_t in[1] = {(uint64_t)(uintptr_t)row};
  uint32_t out[4];
  auto op = [num, trans](uint64_t (*i)[12], uint32_t (*o)[4]) {
    for (int l = 0; l < 8 * num; ++l)
      if (i[l][0] % 16 != 0)
        failf("ldmatrix: lane %d's row address %p is not 16-byte aligned", l,
              (void*)(uintptr_t)i[l][0]);
    for (int t = 0; t < 32; ++t)
      for (int m = 0; m < num; ++m) {
        uint16_t e[2];
        for (int h = 0; h < 2; ++h) {
          const int rr = trans ? 2 * (t % 4) + h : t / 4, cc = trans ? t / 4 : 2 * (t % 4) + h;
          const uint16_t* base = (const uint16_t*)(uintptr_t)i[8 * m + rr][0];
          e[h] = base[cc];
        }
        o[t][m] = (uint32_t)e[0] | ((uint32_t)e[1] << 16);
      }
  };
  collective(in, 1, out, num, op);
  for (int m = 0; m < num; ++m) r[m] = out[m];
}

inline float bf_lo(uint32_t v) { return __bfloat162float({(uint16_t)(v & 0xffff)}); }
inline float bf_hi(uint32_t v) { return __bfloat162float({(uint16_t)(v >> 16)}); }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, with g = lane / 4, t = lane % 4:
// A (16 x 16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..);
// B (16 x 8): b0 = rows 2t, 2t+1 of column g, b1 = rows 2t+8, 2t+9;
// C, D (16 x 8): c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1).
inline void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  uint64_t in[10];
  for (int k = 0; k < 4; ++k) in[k] = a[k];
  in[4] = b0;
  in[5] = b1;
  for (int k = 0; k < 4; ++k) {
    uint32_t u;
    std::memcpy(&u, &c[k], 4);
    in[6 + k] = u;
  }
  uint32_t out[4];
  collective(in, 10, out, 4, [](uint64_t (*i)[12], uint32_t (*o)[4]) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const uint32_t a[4] = {(uint32_t)i[l][0], (uint32_t)i[l][1], (uint32_t)i[l][2],
                             (uint32_t)i[l][3]};
      A[g][2 * t] = bf_lo(a[0]), A[g][2 * t + 1] = bf_hi(a[0]);
      A[g + 8][2 * t] = bf_lo(a[1]), A[g + 8][2 * t + 1] = bf_hi(a[1]);
      A[g][2 * t + 8] = bf_lo(a[2]), A[g][2 * t + 9] = bf_hi(a[2]);
      A[g + 8][2 * t + 8] = bf_lo(a[3]), A[g + 8][2 * t + 9] = bf_hi(a[3]);
      const uint32_t b0 = (uint32_t)i[l][4], b1 = (uint32_t)i[l][5];
      B[2 * t][g] = bf_lo(b0), B[2 * t + 1][g] = bf_hi(b0);
      B[2 * t + 8][g] = bf_lo(b1), B[2 * t + 9][g] = bf_hi(b1);
      for (int k = 0; k < 4; ++k) {
        float f;
        const uint32_t u = (uint32_t)i[l][6 + k];
        std::memcpy(&f, &u, 4);
        C[g + (k >= 2 ? 8 : 0)][2 * t + (k & 1)] = f;
      }
    }
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int k = 0; k < 4; ++k) {
        const int row = g + (k >= 2 ? 8 : 0), col = 2 * t + (k & 1);
        float acc = C[row][col];
        for (int kk = 0; kk < 16; ++kk) acc += A[row][kk] * B[kk][col];
        std::memcpy(&o[l][k], &acc, 4);
      }
    }
  });
  for (int k = 0; k < 4; ++k) std::memcpy(&c[k], &out[k], 4);
}

inline uint32_t ballot(bool pred) {
  uint64_t in[1] = {pred ? 1ull : 0ull};
  uint32_t out[1];
  collective(in, 1, out, 1, [](uint64_t (*i)[12], uint32_t (*o)[4]) {
    uint32_t bits = 0;
    for (int l = 0; l < 32; ++l) bits |= (uint32_t)(i[l][0] & 1) << l;
    for (int l = 0; l < 32; ++l) o[l][0] = bits;
  });
  return out[0];
}

inline unsigned dynamic_smem_bytes() { return (unsigned)S.dyn_bytes; }

// A 16-byte vector load or store (`ld.global.v4` / `st.global.v4`, common.cuh's load16 /
// store16): a GPU faults on an address off 16 bytes, where a CPU would not.
inline void check_vector_align(const void* p, const char* what) {
  if ((uintptr_t)p % 16 != 0) failf("a misaligned 16-byte %s at %p (it must be 16-byte aligned)", what, p);
}

// cp.async.{ca,cg}.shared.global [dst], [src], fill, bytes: `fill` (4, 8 or 16) bytes written,
// both addresses aligned to it.
inline void cp_async(void* dst, const void* src, int bytes, int fill) {
  if (fill != 4 && fill != 8 && fill != 16) failf("cp.async of %d bytes (4, 8 or 16)", fill);
  if ((uintptr_t)dst % fill != 0 || (uintptr_t)src % fill != 0)
    failf("a misaligned cp.async of %d bytes: shared %p, global %p (each must be %d-byte "
          "aligned)",
          fill, dst, src, fill);
  if (bytes < 0 || bytes > fill) failf("cp.async reading %d of %d bytes", bytes, fill);
  const Copy c{dst, src, bytes, fill};
  if (S.schedule & 2)
    land({c});
  else
    me().groups.back().push_back(c);
}
inline void cp_async_commit() { me().groups.emplace_back(); }
inline void cp_async_wait(int keep) { retire_groups(me(), (size_t)keep); }

}  // namespace emu

// Blocks run on one host thread: every write is seen by every block at once (see the top).
inline void __threadfence() {}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}

#define threadIdx (emu::me().idx)
#define blockIdx (emu::S.bidx)
#define blockDim (emu::S.block)
#define gridDim (emu::S.grid)

#define __syncthreads() emu::barrier(__FILE__, __LINE__)
inline void __syncwarp(unsigned = 0xffffffffu) { emu::syncwarp(); }
template <typename T>
inline T __shfl_sync(unsigned, T v, int src, int = 32) {
  return emu::shfl(v, src, false);
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask, int = 32) {
  return emu::shfl(v, mask, true);
}
