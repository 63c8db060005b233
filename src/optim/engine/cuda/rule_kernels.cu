// The step engine's CUDA kernel: each block updates one chunk of one parameter with a rule's
// element arithmetic, the CPU's (rules/*.h; this file is built with --fmad=false so that the bits
// agree), skipping on the scaler's flag without a host read. One kernel template for every rule
// of rules/all.h, instantiated for the legal matrix of engine/instances.h.
#include "optim/engine/cuda/rule_kernels.cuh"

#include "optim/engine/instances.h"
#include "optim/rules/all.h"

#include <cstdint>
#include <cstring>

namespace amp::optim::detail::cuda {
namespace {

template <typename P, typename S>
__device__ engine::Pointers<P, S> typed(const StepTensor& t) {
  engine::Pointers<P, S> p{static_cast<typename P::Raw*>(t.param),
                           static_cast<typename P::Raw*>(t.grad),
                           t.master,
                           static_cast<typename P::Raw*>(t.comp),
                           {}};
#pragma unroll
  for (int s = 0; s < kMaxStateSlots; ++s) p.state[s] = static_cast<typename S::Raw*>(t.state[s]);
  return p;
}

// Thread 0 works out the block's constants once; the others read them from shared memory.
template <typename Scalars, typename Make>
__device__ Scalars block_scalars(const Make& make) {
  __shared__ Scalars shared;
  if (threadIdx.x == 0) shared = make();
  __syncthreads();
  return shared;
}

// Elements a thread takes at once in the vector path: 16 bytes of bfloat16/float16 (32 of float).
constexpr int kVec = 8;

__device__ bool aligned16(const void* ptr) {
  return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <typename T>
__device__ void load_vec(T (&dst)[kVec], const T* src) {
  static_assert(sizeof(T) * kVec % 16 == 0, "whole 16-byte words");
#pragma unroll
  for (int q = 0; q < static_cast<int>(sizeof(T) * kVec / 16); ++q) {
    const uint4 word = reinterpret_cast<const uint4*>(src)[q];
    memcpy(reinterpret_cast<char*>(dst) + 16 * q, &word, 16);
  }
}

template <typename T>
__device__ void store_vec(T* dst, const T (&src)[kVec]) {
#pragma unroll
  for (int q = 0; q < static_cast<int>(sizeof(T) * kVec / 16); ++q) {
    uint4 word;
    memcpy(&word, reinterpret_cast<const char*>(src) + 16 * q, 16);
    reinterpret_cast<uint4*>(dst)[q] = word;
  }
}

// Runs element(pointers, scalars, key, i, index) over the block's chunk, then writes the unscaled
// gradient. When every tensor of the parameter is 16-byte aligned (chunks start at multiples of
// kStepChunkElems, so then every chunk is), each thread loads 8 elements of each tensor
// in 16-byte words, updates them in registers and stores them back; the rest of the chunk (or a
// misaligned parameter) goes element by element. Both run the same element arithmetic.
template <typename P, typename S, typename Scalars, typename Element>
__device__ void run_chunk(const StepMeta& meta, const StepLaunchArgs& args, const Scalars& c,
                          float count, const Element& element) {
  const StepTensor& t = meta.tensor[meta.block_tensor[blockIdx.x]];
  const engine::Pointers<P, S> p = typed<P, S>(t);
  const uint64_t key = engine::tensor_key(args.seed, t.stream, static_cast<uint64_t>(count));
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kStepChunkElems;
  const int64_t end = t.numel - begin < kStepChunkElems ? t.numel : begin + kStepChunkElems;
  const bool unscale = args.grad_scale != nullptr;
  int64_t scalar_from = begin;
  bool aligned =
      aligned16(t.param) && aligned16(t.grad) && aligned16(t.master) && aligned16(t.comp);
#pragma unroll
  for (int s = 0; s < kMaxStateSlots; ++s) aligned = aligned && aligned16(t.state[s]);
  if (aligned) {
    const int64_t rounds = (end - begin) / kVec;
    for (int64_t r = threadIdx.x; r < rounds; r += blockDim.x) {
      const int64_t base = begin + r * kVec;
      typename P::Raw param[kVec], grad[kVec], comp[kVec];
      float master[kVec];
      typename S::Raw state[kMaxStateSlots][kVec];
      load_vec(param, p.param + base);
      load_vec(grad, p.grad + base);
      if (p.master != nullptr) load_vec(master, p.master + base);
      if (p.comp != nullptr) load_vec(comp, p.comp + base);
      engine::Pointers<P, S> regs{param, grad, master, comp, {}};
#pragma unroll
      for (int s = 0; s < kMaxStateSlots; ++s) {
        if (p.state[s] != nullptr) load_vec(state[s], p.state[s] + base);
        regs.state[s] = state[s];
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        element(regs, c, key, k, base + k);
        if (unscale) grad[k] = P::store(P::load(grad[k]) / c.scale);
      }
      // Every tensor the step keeps is written by the element arithmetic.
      store_vec(p.param + base, param);
      if (unscale) store_vec(p.grad + base, grad);
      if (p.master != nullptr) store_vec(p.master + base, master);
      if (p.comp != nullptr) store_vec(p.comp + base, comp);
#pragma unroll
      for (int s = 0; s < kMaxStateSlots; ++s) {
        if (p.state[s] != nullptr) store_vec(p.state[s] + base, state[s]);
      }
    }
    scalar_from = begin + rounds * kVec;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
    element(p, c, key, i, i);
    if (unscale) p.grad[i] = P::store(P::load(p.grad[i]) / c.scale);
  }
}

bool __device__ skipped(const StepLaunchArgs& args) {
  return args.found_inf != nullptr && *args.found_inf != 0.0f;
}

float __device__ scale_of(const StepLaunchArgs& args) {
  return args.grad_scale != nullptr ? *args.grad_scale : 1.0f;
}

template <typename Rule, typename P, typename S, WriteBack W, bool kVariant>
__global__ void __launch_bounds__(kStepThreads)
    rule_kernel(const __grid_constant__ StepMeta meta, const typename Rule::Hyper hyper,
                const StepLaunchArgs args) {
  if (skipped(args)) return;
  const StepTensor& t = meta.tensor[meta.block_tensor[blockIdx.x]];
  const float count = *t.step + 1.0f;
  using Scalars = typename Rule::Scalars;
  const Scalars c = block_scalars<Scalars>(
      [&] { return Rule::scalars(hyper, count, t.first != 0, scale_of(args)); });
  run_chunk<P, S>(meta, args, c, count,
                  [](const auto& p, const Scalars& c, uint64_t key, int64_t i, int64_t index) {
                    Rule::template element<P, S, W, kVariant>(p, c, key, i, index);
                  });
}

__global__ void count_steps_kernel(const __grid_constant__ StepCounts counts,
                                   const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k < counts.count) *counts.step[k] += 1.0f;
}

}  // namespace

cudaError_t launch_rule_step(const StepMeta& meta, const void* hyper, const StepLaunchArgs& args,
                             cudaStream_t stream) {
  if (meta.block_count == 0) return cudaSuccess;
  bool launched = false;
  engine::with_rule(args.kind.rule, [&](auto rule) {
    using Rule = decltype(rule);
    const auto& typed_hyper = *static_cast<const typename Rule::Hyper*>(hyper);
    launched = engine::with_instance<Rule>(args.kind, [&](auto p, auto s, auto w, auto variant) {
      rule_kernel<Rule, decltype(p), decltype(s), decltype(w)::value, decltype(variant)::value>
          <<<meta.block_count, kStepThreads, 0, stream>>>(meta, typed_hyper, args);
    });
  });
  return launched ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t launch_count_steps(const StepCounts& counts, const float* found_inf,
                               cudaStream_t stream) {
  if (counts.count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = (counts.count + kThreads - 1) / kThreads;
  count_steps_kernel<<<blocks, kThreads, 0, stream>>>(counts, found_inf);
  return cudaGetLastError();
}

}  // namespace amp::optim::detail::cuda
