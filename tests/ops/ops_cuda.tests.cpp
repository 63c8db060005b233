// GPU tests of amp's fused ops: the CUDA kernels against ATen's CUDA ops, amp's CPU kernels and
// float64 references where a multi-tensor launch goes wrong first (unaligned starts, views, launch
// slots vs list indices, launch boundaries, 64-bit sizes, reduction order, graph capture).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <amp/ops.h>

#include "kernels/launch_plan.h"
#include "ops/cuda/kernels.cuh"
#include "support/bits.h"
#include "support/reference_scale_update.h"

namespace {

using amp_test::raw_bits;
using amp_test::same_bits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const torch::Device kCuda(torch::kCUDA);

// The CUDA kernel's launch geometry: one block per chunk, at most this many tensors and blocks in
// one launch.
constexpr int64_t kChunk = amp::detail::cuda::kChunkElems;
const amp::kernels::LaunchLimits kCudaLimits{amp::detail::cuda::kChunkElems,
                                             amp::detail::cuda::kMaxTensorsPerLaunch,
                                             amp::detail::cuda::kMaxBlocksPerLaunch};

torch::TensorOptions on(torch::ScalarType dtype, torch::Device device = kCuda) {
  return torch::TensorOptions().dtype(dtype).device(device);
}

torch::Tensor zero_flag(torch::Device device = kCuda) {
  return torch::zeros({1}, on(torch::kFloat, device));
}

torch::Tensor scalar(float v, torch::Device device = kCuda) {
  return torch::full({1}, v, on(torch::kFloat, device));
}

/// Normal values times `scale`, drawn on the device in float64 and rounded to `dtype`.
torch::Tensor scaled_randn(torch::IntArrayRef shape, torch::ScalarType dtype, double scale = 4096.0,
                           torch::Device device = kCuda) {
  return (torch::randn(shape, on(torch::kDouble, device)) * scale).to(dtype);
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& list) {
  std::vector<torch::Tensor> out;
  for (const auto& t : list) out.push_back(t.clone());
  return out;
}

/// ATen's CUDA unscale of one tensor, the reference. Some torch versions (2.11) have no bfloat16
/// CUDA kernel: a bfloat16 tensor then goes through float32, which is the same arithmetic (the
/// float32 product rounded once to bfloat16) and sets the same flag.
void aten_unscale_one(torch::Tensor g, torch::Tensor& found, const torch::Tensor& inv) {
  if (g.numel() == 0) return;
  if (g.scalar_type() != torch::kBFloat16) {
    at::_amp_foreach_non_finite_check_and_unscale_({g}, found, inv);
    return;
  }
  auto wide = g.to(torch::kFloat);
  at::_amp_foreach_non_finite_check_and_unscale_({wide}, found, inv);
  g.copy_(wide);
}

/// ATen's CUDA unscale, one call per tensor (ATen's op takes one dtype per call).
void aten_unscale(const std::vector<torch::Tensor>& grads, torch::Tensor& found,
                  const torch::Tensor& inv) {
  for (const auto& g : grads) aten_unscale_one(g, found, inv);
}

/// The L2 norm of `grads * inv` from float64 values (exact products when inv is a power of two).
double reference_norm(const std::vector<torch::Tensor>& grads, double inv) {
  double sumsq = 0.0;
  for (const auto& g : grads) sumsq += (g.to(torch::kDouble) * inv).pow(2).sum().item<double>();
  return std::sqrt(sumsq);
}

/// True when `got` is one of the two float32 values around `exact` (float32 rounding of a
/// float64 result, in either direction; exact itself when it is a float32).
bool rounds_to(float got, double exact) {
  float down = static_cast<float>(exact);
  if (static_cast<double>(down) > exact) down = std::nextafter(down, -kInf);
  if (static_cast<double>(down) == exact) return got == down;
  return got == down || got == std::nextafter(down, kInf);
}

/// Indices i where pred(i) is false, as text for a failure message ("" when none).
std::string failing(int64_t count, const std::function<bool(int64_t)>& pred) {
  std::ostringstream out;
  int shown = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (!pred(i) && shown++ < 20) out << i << ' ';
  }
  return out.str();
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

TEST_CASE("CUDA ops match ATen's CUDA ops on a mixed-dtype list", "[ops][cuda]") {
  torch::manual_seed(8);
  std::vector<torch::Tensor> grads = {scaled_randn({1 << 20}, torch::kFloat),
                                      scaled_randn({65537}, torch::kHalf).narrow(0, 1, 65535),
                                      scaled_randn({300001}, torch::kBFloat16),
                                      scaled_randn({1001}, torch::kDouble),
                                      torch::randn({300, 200}, on(torch::kFloat)).t(),
                                      torch::randn({64, 50}, on(torch::kHalf)).narrow(1, 3, 40)};
  for (int i = 0; i < 2000; ++i) grads.push_back(scaled_randn({i % 97}, torch::kFloat));
  grads[2][300000] = kNaN;
  for (float inv : {1.0f / 65536.0f, 1.0f}) {
    std::vector<torch::Tensor> mine, cpu_ref;
    for (auto& g : grads) {
      mine.push_back(g.clone());
      cpu_ref.push_back(g.cpu());
    }
    auto found = zero_flag(), found_ref = zero_flag(torch::kCPU);
    auto flags = torch::zeros({static_cast<int64_t>(grads.size())}, on(torch::kFloat));
    amp::non_finite_check_and_unscale_(mine, found, scalar(inv), flags);
    for (auto& g : cpu_ref) {
      at::_amp_foreach_non_finite_check_and_unscale_({g}, found_ref, scalar(inv, torch::kCPU));
    }
    for (size_t i = 0; i < grads.size(); ++i) CHECK(same_bits(mine[i].cpu(), cpu_ref[i]));
    CHECK(found.item<float>() == 1.0f);
    CHECK(flags.nonzero().flatten().cpu().equal(torch::tensor({int64_t{2}})));
  }
  grads[2][300000] = 0.0f;
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm(grads, found, scalar(0.5f), true);
  auto found_cpu = zero_flag(torch::kCPU);
  std::vector<torch::Tensor> cpu_grads;
  for (auto& g : grads) cpu_grads.push_back(g.cpu());
  auto [total_cpu, per_cpu] =
      amp::unscale_norm(cpu_grads, found_cpu, scalar(0.5f, torch::kCPU), true);
  CHECK(total.item<double>() == Approx(total_cpu.item<double>()).epsilon(1e-6));
  CHECK(torch::allclose(per.cpu(), per_cpu, 1e-5));
  auto s1 = scalar(65536.0f), s2 = scalar(65536.0f);
  auto t1 = torch::zeros({1}, on(torch::kInt)), t2 = t1.clone();
  for (float f : {0.f, 1.f, 0.f, 0.f, 0.f}) {
    amp::update_scale_(s1, t1, scalar(f), 2.0, 0.5, 2);
    at::_amp_update_scale_(s2, t2, scalar(f), 2.0, 0.5, 2);
    CHECK(same_bits(s1, s2));
    CHECK(torch::equal(t1, t2));
  }
}

TEST_CASE("CUDA unscaling matches ATen at every size, dtype and non-finite position",
          "[ops][cuda]") {
  torch::manual_seed(9);
  const auto dtype = GENERATE(torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kDouble);
  const float inv = GENERATE(1.0f / 65536.0f, 1.0f);
  // The CPU kernel's boundaries plus the CUDA kernel's chunk boundaries, each from an aligned
  // and from an unaligned start, so both the 16-byte and the scalar paths meet every edge.
  std::vector<int64_t> sizes = {0,     1,     7,     15,    16,    17,    33,
                                32767, 32768, 32769, 65535, 65536, 65537, (1 << 20) + 3};
  for (int64_t n : {kChunk * 2 - 1, kChunk * 2, kChunk * 2 + 1}) sizes.push_back(n);
  for (int64_t n : sizes) {
    for (int64_t offset : {int64_t{0}, int64_t{1}}) {
      INFO("numel " << n << " offset " << offset << " dtype " << dtype);
      // Narrowed on the device, so offset 1 is an unaligned start there.
      const auto full = scaled_randn({n + offset}, dtype, 4096.0, torch::kCPU);
      auto mine = full.to(kCuda).narrow(0, offset, n);
      auto ref = full.narrow(0, offset, n).clone();
      auto found = zero_flag(), found_ref = zero_flag(torch::kCPU);
      amp::non_finite_check_and_unscale_({mine}, found, scalar(inv));
      at::_amp_foreach_non_finite_check_and_unscale_({ref}, found_ref, scalar(inv, torch::kCPU));
      CHECK(same_bits(mine.cpu(), ref));
      CHECK(found.item<float>() == found_ref.item<float>());
    }
  }
  // Non-finite values at the first, last and chunk-boundary positions.
  const int64_t n = kChunk * 2 + 1;
  for (int64_t pos : {int64_t{0}, kChunk - 1, kChunk, n - 1}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      INFO("position " << pos << " value " << bad);
      auto g = scaled_randn({n}, dtype, 4096.0, torch::kCPU);
      g[pos] = bad;
      auto mine = g.to(kCuda);
      auto found = zero_flag(), found_ref = zero_flag(torch::kCPU);
      amp::non_finite_check_and_unscale_({mine}, found, scalar(inv));
      at::_amp_foreach_non_finite_check_and_unscale_({g}, found_ref, scalar(inv, torch::kCPU));
      CHECK(found.item<float>() == 1.0f);
      CHECK(same_bits(mine.cpu(), g));
    }
  }
  // found_inf is a plain store: 1 on entry stays 1.
  auto g = scaled_randn({1000}, dtype);
  auto found = scalar(1.0f);
  amp::non_finite_check_and_unscale_({g}, found, scalar(inv));
  CHECK(found.item<float>() == 1.0f);
}

TEST_CASE("CUDA ops on views starting 1 to 8 elements into a device allocation touch only the view",
          "[ops][cuda]") {
  torch::manual_seed(11);
  const auto dtype = GENERATE(torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kDouble);
  constexpr int64_t kGuard = 64;  // more than one 16-byte vector of any dtype
  constexpr float kInv = 1.0f / 1024.0f;
  for (int64_t k : {int64_t{1}, int64_t{3}}) {
    for (int64_t n : {k * kChunk - 1, k * kChunk, k * kChunk + 1}) {
      for (int64_t offset = 1; offset <= 8; ++offset) {
        INFO("dtype " << dtype << " numel " << n << " offset " << offset);
        // Allocated on the device and narrowed there, as a parameter packed into a flat buffer:
        // the view starts `offset` elements past the allocator's aligned address. The guards
        // hold NaN before and inf after: a kernel that reads past either end sets found_inf, one
        // that writes there changes their bits.
        auto base = scaled_randn({offset + n + kGuard}, dtype);
        base.narrow(0, 0, offset).fill_(kNaN);
        base.narrow(0, offset + n, kGuard).fill_(kInf);
        const auto original = base.clone();
        auto view = base.narrow(0, offset, n);
        const auto guards_unchanged = [&] {
          return torch::equal(raw_bits(base.narrow(0, 0, offset)),
                              raw_bits(original.narrow(0, 0, offset))) &&
                 torch::equal(raw_bits(base.narrow(0, offset + n, kGuard)),
                              raw_bits(original.narrow(0, offset + n, kGuard)));
        };

        auto found = zero_flag();
        auto [total, unused] = amp::unscale_norm({view}, found, scalar(kInv), false);
        CHECK(found.item<float>() == 0.0f);
        CHECK(rounds_to(total.item<float>(), reference_norm({view}, kInv)));

        auto ref = view.clone();  // an aligned copy for ATen's CUDA op
        auto found_ref = zero_flag();
        aten_unscale_one(ref, found_ref, scalar(kInv));
        amp::non_finite_check_and_unscale_({view}, found, scalar(kInv));
        CHECK(same_bits(view, ref));
        CHECK(found.item<float>() == 0.0f);
        CHECK(found_ref.item<float>() == 0.0f);
        CHECK(guards_unchanged());

        // Clip coefficient exactly 0.5 (max_norm 1, total_norm 2, eps 0): every element becomes
        // x * 0.5 rounded to its dtype, as ATen's mul_ rounds it.
        amp::clip_unscaled_({view}, scalar(1.0f), scalar(2.0f), 1.0, 0.0);
        ref.mul_(0.5);
        CHECK(same_bits(view, ref));
        CHECK(guards_unchanged());
      }
    }
  }
}

TEST_CASE("CUDA ops write non-dense views back in place and leave the rest of their storage alone",
          "[ops][cuda]") {
  torch::manual_seed(12);
  using ViewFn = std::function<torch::Tensor(const torch::Tensor&)>;
  const std::vector<std::pair<const char*, ViewFn>> views = {
      {"columns 3..102", [](const torch::Tensor& b) { return b.narrow(1, 3, 100); }},
      {"every other column",
       [](const torch::Tensor& b) { return b.narrow(1, 1, 256).slice(1, 0, 256, 2); }},
      {"one column", [](const torch::Tensor& b) { return b.select(1, 7); }},
      {"transposed block",
       [](const torch::Tensor& b) { return b.narrow(0, 1, 299).narrow(1, 1, 256).t(); }},
      {"transposed whole (dense)", [](const torch::Tensor& b) { return b.t(); }},
      {"rows 1..298, columns from 5",
       [](const torch::Tensor& b) { return b.narrow(0, 1, 298).narrow(1, 5, 252); }},
  };
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kHalf, torch::kBFloat16,
                                                 torch::kDouble};
  constexpr float kInv = 1.0f / 1024.0f;
  // Each view over its own 300 x 257 allocation whose elements outside the view are NaN: read
  // there, found_inf is set; written there, their bits change. Every dtype meets every view.
  std::vector<torch::Tensor> bases, outside, mine;
  std::vector<torch::Tensor> ref_bases, ref_views;
  for (size_t d = 0; d < dtypes.size(); ++d) {
    for (const auto& named_view : views) {
      const ViewFn& view_of = named_view.second;
      auto base = scaled_randn({300, 257}, dtypes[d]);
      auto in_view = torch::zeros({300, 257}, on(torch::kBool));
      view_of(in_view).fill_(true);
      base.masked_fill_(in_view.logical_not(), kNaN);
      bases.push_back(base);
      outside.push_back(in_view.logical_not());
      mine.push_back(view_of(base));
      ref_bases.push_back(base.clone());
      ref_views.push_back(view_of(ref_bases.back()));
    }
  }
  const auto originals = clones(bases);
  const auto describe = [&](size_t i) {
    std::ostringstream out;
    out << views[i % views.size()].first << ", " << dtypes[i / views.size()];
    return out.str();
  };
  const auto check_storage = [&](const char* step) {
    for (size_t i = 0; i < bases.size(); ++i) {
      INFO(step << ": " << describe(i));
      CHECK(same_bits(bases[i], ref_bases[i]));
      CHECK(torch::equal(raw_bits(bases[i]).masked_select(outside[i]),
                         raw_bits(originals[i]).masked_select(outside[i])));
    }
  };

  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm(mine, found, scalar(kInv), true);
  CHECK(found.item<float>() == 0.0f);
  const auto per_cpu = per.cpu();
  for (size_t i = 0; i < mine.size(); ++i) {
    INFO("norm of " << describe(i));
    CHECK(rounds_to(per_cpu[i].item<float>(), reference_norm({mine[i]}, kInv)));
  }
  CHECK(rounds_to(total.item<float>(), reference_norm(mine, kInv)));

  auto found_ref = zero_flag();
  amp::non_finite_check_and_unscale_(mine, found, scalar(kInv));
  aten_unscale(ref_views, found_ref, scalar(kInv));
  CHECK(found.item<float>() == 0.0f);
  CHECK(found_ref.item<float>() == 0.0f);
  check_storage("unscale");

  amp::clip_unscaled_(mine, scalar(1.0f), scalar(2.0f), 1.0, 0.0);
  for (auto& v : ref_views) v.mul_(0.5);
  check_storage("clip by 0.5");
}

TEST_CASE("CUDA overflow attribution names list indices across 3000 tensors and many launches",
          "[ops][cuda]") {
  torch::manual_seed(13);
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kHalf, torch::kBFloat16,
                                                 torch::kDouble};
  const int64_t count = 3000;
  std::vector<torch::Tensor> clean;
  std::vector<int64_t> numels;
  for (int64_t i = 0; i < count; ++i) {
    // Empty tensors take no launch slot, and two-chunk tensors take two blocks, so the kernel's
    // slot of a tensor is neither its list index nor a fixed offset from it.
    int64_t n = 1 + (i * 37) % 1000;
    if (i % 11 == 5) n = 0;
    if (i % 500 == 7) n = kChunk + 4465;
    numels.push_back(n);
    clean.push_back(scaled_randn({n}, dtypes[i % 4]));
  }
  REQUIRE(amp::kernels::plan_launches(numels, kCudaLimits).size() >= 10);

  const std::vector<int64_t> bad = {255, 256, 1500, 2999};
  auto grads = clones(clean);
  grads[255][-1] = kNaN;
  grads[256][0] = kInf;
  grads[1500][grads[1500].numel() / 2] = -kInf;
  grads[2999][-1] = kNaN;
  auto ref = clones(grads);
  for (float inv : {0.25f, 1.0f}) {
    INFO("inv_scale " << inv);
    auto mine = clones(grads);
    auto found = zero_flag(), found_ref = zero_flag();
    auto flags = torch::zeros({count}, on(torch::kFloat));
    amp::non_finite_check_and_unscale_(mine, found, scalar(inv), flags);
    auto expected = clones(ref);
    aten_unscale(expected, found_ref, scalar(inv));
    CHECK(found.item<float>() == 1.0f);
    CHECK(found_ref.item<float>() == 1.0f);
    CHECK(flags.nonzero().flatten().cpu().equal(torch::tensor(bad)));
    CHECK(flags.eq(0).logical_or(flags.eq(1)).all().item<bool>());
    CHECK(failing(count, [&](int64_t i) { return same_bits(mine[i], expected[i]); }) == "");
  }

  // Per-tensor norms land at their list index too (float64 references; exact products).
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm(clean, found, scalar(0.25f), true);
  CHECK(found.item<float>() == 0.0f);
  REQUIRE(per.numel() == count);
  const auto per_cpu = per.cpu();
  std::vector<double> ref_norms;
  for (const auto& g : clean) ref_norms.push_back(reference_norm({g}, 0.25));
  CHECK(failing(count, [&](int64_t i) {
          return rounds_to(per_cpu[i].item<float>(), ref_norms[i]);
        }) == "");
  CHECK(rounds_to(total.item<float>(), reference_norm(clean, 0.25)));
}

TEST_CASE("A tensor split across two CUDA launches is checked and unscaled on both sides",
          "[ops][cuda]") {
  torch::manual_seed(14);
  // The first tensor fills all but 72 blocks of the first launch, so the second starts in the
  // first launch and continues in the next one.
  const int64_t first_chunks = kCudaLimits.max_blocks - 72;
  const std::vector<int64_t> numels = {first_chunks * kChunk, 200 * kChunk + 17};
  const auto launches = amp::kernels::plan_launches(numels, kCudaLimits);
  REQUIRE(launches.size() == 2);
  REQUIRE(launches[0].tensors == std::vector<int64_t>{0, 1});
  REQUIRE(launches[1].tensors == std::vector<int64_t>{1});
  REQUIRE(launches[1].blocks.front().chunk == 72);
  const int64_t boundary = 72 * kChunk;  // first element of tensor 1 in the second launch

  const std::vector<torch::Tensor> clean = {scaled_randn({numels[0]}, torch::kFloat),
                                            scaled_randn({numels[1]}, torch::kFloat)};
  for (int64_t pos : {boundary - 1, boundary}) {
    INFO("NaN at element " << pos << " of tensor 1");
    auto grads = clones(clean);
    grads[1][pos] = kNaN;
    auto expected = clones(grads);
    auto found = zero_flag(), found_ref = zero_flag();
    auto flags = torch::zeros({2}, on(torch::kFloat));
    amp::non_finite_check_and_unscale_(grads, found, scalar(1.0f / 512.0f), flags);
    aten_unscale(expected, found_ref, scalar(1.0f / 512.0f));
    CHECK(found.item<float>() == 1.0f);
    CHECK(flags.cpu().equal(torch::tensor({0.0f, 1.0f})));
    CHECK(same_bits(grads[0], expected[0]));
    CHECK(same_bits(grads[1], expected[1]));
  }
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm(clean, found, scalar(1.0f / 512.0f), true);
  const auto per_cpu = per.cpu();
  CHECK(rounds_to(per_cpu[0].item<float>(), reference_norm({clean[0]}, 1.0 / 512.0)));
  CHECK(rounds_to(per_cpu[1].item<float>(), reference_norm({clean[1]}, 1.0 / 512.0)));
  CHECK(rounds_to(total.item<float>(), reference_norm(clean, 1.0 / 512.0)));
}

TEST_CASE("CUDA ops handle a tensor of more than 2^31 elements", "[ops][cuda]") {
  torch::manual_seed(15);
  const auto dtype = GENERATE(torch::kHalf, torch::kBFloat16);
  const int64_t n = (int64_t{1} << 31) + 100003;  // 4 GiB in a 16-bit dtype
  constexpr float kInv = 1.0f / 1024.0f;
  auto big = torch::randn({n}, on(dtype)).mul_(64);
  std::vector<torch::Tensor> grads = {scaled_randn({1000}, torch::kFloat), big,
                                      scaled_randn({33}, torch::kBFloat16)};

  // The read-only norm first, on finite values; the reference accumulates in float64.
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm({big}, found, scalar(kInv), true);
  CHECK(found.item<float>() == 0.0f);
  const double ref_norm =
      torch::linalg_vector_norm(big, 2, c10::nullopt, false, torch::kDouble).item<double>() / 1024;
  CHECK(total.item<double>() == Approx(ref_norm).epsilon(1e-6));

  big[n - 1] = kNaN;
  const auto before = big.clone();
  auto flags = torch::zeros({3}, on(torch::kFloat));
  amp::non_finite_check_and_unscale_(grads, found, scalar(kInv), flags);
  CHECK(found.item<float>() == 1.0f);
  CHECK(flags.cpu().equal(torch::tensor({0.0f, 1.0f, 0.0f})));
  CHECK(torch::isnan(big[n - 1]).item<bool>());
  // Every other element as float32 multiply and round to nearest even, by ATen's elementwise ops
  // (which split 64-bit sizes themselves).
  {
    const auto expected = (before.narrow(0, 0, n - 1).to(torch::kFloat) * kInv).to(dtype);
    CHECK(torch::equal(raw_bits(big.narrow(0, 0, n - 1)), raw_bits(expected)));
  }
  // And spot checks from host arithmetic around 2^31, where 32-bit element indices would wrap.
  const int64_t two31 = int64_t{1} << 31;
  for (int64_t pos : {int64_t{0}, kChunk, two31 - 1, two31, two31 + 1, n - 2}) {
    INFO("element " << pos);
    const float x = before[pos].item<float>();
    const auto want = torch::tensor({x * kInv}).to(dtype);
    CHECK(torch::equal(raw_bits(big[pos].cpu().reshape({1})), raw_bits(want)));
  }
}

TEST_CASE("CUDA unscale_norm and clip_unscaled_ match ATen's unscale and clip_grad_norm_",
          "[ops][cuda]") {
  torch::manual_seed(16);
  const double max_norm = GENERATE(0.5, 1.0e9);
  constexpr float kInv = 1.0f / 4096.0f;
  // float32 only: clip_grad_norm_ rounds a lower-precision tensor's norm to its dtype, which
  // would move its coefficient further than the comparison below allows.
  const std::vector<torch::Tensor> grads = {
      scaled_randn({70000}, torch::kFloat), scaled_randn({999}, torch::kFloat),
      scaled_randn({40, 60}, torch::kFloat).t(), scaled_randn({300001}, torch::kFloat)};
  std::vector<torch::Tensor> params;
  for (const auto& g : grads) {
    auto p = torch::zeros_like(g, torch::MemoryFormat::Preserve).requires_grad_(true);
    p.mutable_grad() = g.clone();
    params.push_back(p);
  }
  auto mine = clones(grads);
  auto found = zero_flag();
  auto [total, per] = amp::unscale_norm(mine, found, scalar(kInv), false);
  amp::clip_unscaled_(mine, scalar(kInv), total, max_norm);

  std::vector<torch::Tensor> ref_grads;
  for (auto& p : params) ref_grads.push_back(p.grad());
  auto found_ref = zero_flag();
  aten_unscale(ref_grads, found_ref, scalar(kInv));
  const double ref_total = torch::nn::utils::clip_grad_norm_(params, max_norm);
  CHECK(found.item<float>() == 0.0f);
  CHECK(total.item<double>() == Approx(ref_total).epsilon(1e-5));
  CHECK(rounds_to(total.item<float>(), reference_norm(grads, kInv)));
  REQUIRE(ref_total > 1.0);  // so max_norm 0.5 clips
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("tensor " << i);
    if (max_norm > 1.0e6) {
      CHECK(same_bits(mine[i], params[i].grad()));  // coefficient 1: the plain unscale
    } else {
      CHECK(torch::allclose(mine[i], params[i].grad(), 1e-5, 1e-9));
    }
  }

  // An overflow: found_inf set and a non-finite norm, as ATen's unscale and clip_grad_norm_.
  auto bad = clones(grads);
  bad[3][12345] = kInf;
  auto found_bad = zero_flag();
  auto [bad_total, unused] = amp::unscale_norm(bad, found_bad, scalar(kInv), false);
  CHECK(found_bad.item<float>() == 1.0f);
  CHECK_FALSE(std::isfinite(bad_total.item<float>()));
}

TEST_CASE("CUDA clip_unscaled_ equals amp's CPU kernel bit for bit in every dtype", "[ops][cuda]") {
  torch::manual_seed(21);
  const double max_norm = GENERATE(0.3, 1.0e9);
  constexpr float kInv = 1.0f / 4096.0f;
  std::vector<torch::Tensor> grads = {scaled_randn({70001}, torch::kFloat),
                                      scaled_randn({65537}, torch::kHalf).narrow(0, 3, 65533),
                                      scaled_randn({131073}, torch::kBFloat16),
                                      scaled_randn({4099}, torch::kDouble),
                                      scaled_randn({64, 50}, torch::kHalf).narrow(1, 3, 40),
                                      scaled_randn({90, 90}, torch::kBFloat16).t()};
  std::vector<torch::Tensor> on_cpu;
  for (const auto& g : grads) on_cpu.push_back(g.cpu());

  auto found = zero_flag(), found_cpu = zero_flag(torch::kCPU);
  auto [total, unused] = amp::unscale_norm(grads, found, scalar(kInv), false);
  auto [total_cpu, unused_cpu] =
      amp::unscale_norm(on_cpu, found_cpu, scalar(kInv, torch::kCPU), false);
  CHECK(found.item<float>() == 0.0f);
  CHECK(rounds_to(total.item<float>(), reference_norm(on_cpu, kInv)));
  CHECK(rounds_to(total_cpu.item<float>(), reference_norm(on_cpu, kInv)));
  // The same norm value on both devices, so the coefficients are formed from equal inputs.
  amp::clip_unscaled_(grads, scalar(kInv), total, max_norm);
  amp::clip_unscaled_(on_cpu, scalar(kInv, torch::kCPU), total.cpu().reshape({1}), max_norm);
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("tensor " << i << " dtype " << grads[i].scalar_type());
    CHECK(same_bits(grads[i].cpu(), on_cpu[i]));
  }
}

TEST_CASE("The CUDA scale update matches ATen's at the float32 edges", "[ops][cuda]") {
  const auto state = [](float scale, int tracker) {
    return std::make_pair(torch::full({}, scale, on(torch::kFloat)),
                          torch::full({}, tracker, on(torch::kInt)));
  };
  struct Case {
    const char* what;
    float scale;
    int tracker;
    float found;
    double growth;
    int64_t interval;
  };
  const std::vector<Case> cases = {
      {"growth from 3e38 would overflow: the scale stays", 3.0e38f, 0, 0.0f, 2.0, 1},
      {"growth from FLT_MAX by a hair would overflow", std::numeric_limits<float>::max(), 4, 0.0f,
       1.0000001, 5},
      {"growth from 1e38 stays finite", 1.0e38f, 0, 0.0f, 2.0, 1},
      {"NaN found_inf backs off", 3.0e38f, 3, kNaN, 2.0, 5},
      {"-inf found_inf backs off", 1.0f, 3, -kInf, 2.0, 5},
      {"-0.0 found_inf is clean", 1.0f, 3, -0.0f, 2.0, 5},
      {"a clean step below the interval only counts", 8.0f, 2, 0.0f, 2.0, 5},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    auto [s1, t1] = state(c.scale, c.tracker);
    auto [s2, t2] = state(c.scale, c.tracker);
    const auto found = torch::full({}, c.found, on(torch::kFloat));
    amp::update_scale_(s1, t1, found, c.growth, 0.5, c.interval);
    at::_amp_update_scale_(s2, t2, found, c.growth, 0.5, c.interval);
    CHECK(same_bits(s1, s2));
    CHECK(torch::equal(t1, t2));
    CHECK(std::isfinite(s1.item<float>()));
  }
  // The overflow case by value as well: the scale keeps every bit and the tracker restarts.
  auto [s, t] = state(3.0e38f, 0);
  amp::update_scale_(s, t, torch::zeros({}, on(torch::kFloat)), 2.0, 0.5, 1);
  CHECK(float_bits(s.item<float>()) == float_bits(3.0e38f));
  CHECK(t.item<int>() == 0);

  // Where amp deliberately differs from ATen: a back-off stops at float32's smallest normal
  // value, 2^-126, from it and from below it (ATen halves on into the denormals), as on the CPU.
  for (const float from : {std::numeric_limits<float>::min(), std::numeric_limits<float>::min() * 3,
                           std::numeric_limits<float>::denorm_min()}) {
    INFO("backing off from " << from);
    auto [gpu_scale, gpu_tracker] = state(from, 2);
    auto cpu_scale = torch::full({}, from), cpu_tracker = torch::full({}, 2, torch::kInt);
    const auto found = torch::ones({}, on(torch::kFloat));
    amp::update_scale_(gpu_scale, gpu_tracker, found, 2.0, 0.5, 5);
    amp::update_scale_(cpu_scale, cpu_tracker, found.cpu(), 2.0, 0.5, 5);
    const float expected = from == std::numeric_limits<float>::min() * 3
                               ? std::numeric_limits<float>::min() * 1.5f
                               : std::numeric_limits<float>::min();
    CHECK(float_bits(gpu_scale.item<float>()) == float_bits(expected));
    CHECK(same_bits(gpu_scale.cpu(), cpu_scale));
    CHECK(gpu_tracker.item<int>() == 0);
  }

  // Random trajectories with NaN and inf flags, against ATen's CUDA kernel step by step.
  torch::manual_seed(4);
  for (double growth : {2.0, 1.5}) {
    for (int64_t interval : {1, 3}) {
      auto [a1, b1] = state(3.0e37f, 0);
      auto [a2, b2] = state(3.0e37f, 0);
      for (int step = 0; step < 60; ++step) {
        const float r = torch::rand({1}).item<float>();
        const float f = r < 0.1f ? kNaN : (r < 0.2f ? kInf : (r < 0.3f ? 1.0f : 0.0f));
        const auto found = torch::full({}, f, on(torch::kFloat));
        amp::update_scale_(a1, b1, found, growth, 0.5, interval);
        at::_amp_update_scale_(a2, b2, found, growth, 0.5, interval);
        INFO("growth " << growth << " interval " << interval << " step " << step);
        REQUIRE(same_bits(a1, a2));
        REQUIRE(torch::equal(b1, b2));
      }
    }
  }
}

TEST_CASE("The CUDA update saturates the tracker and counters as the CPU kernel does",
          "[ops][cuda]") {
  amp_test::require_tracker_saturates(
      [](at::Tensor& scale, at::Tensor& tracker, const at::Tensor& found, int64_t interval) {
        amp::update_scale_(scale, tracker, found, 2.0, 0.5, interval);
      },
      kCuda);
  amp_test::require_counters_saturate(kCuda);
}

TEST_CASE("The CUDA scale update with extensions matches amp's CPU kernel", "[ops][cuda]") {
  torch::manual_seed(10);
  amp::ScaleUpdateExtensions ext;
  const int64_t interval = GENERATE(1, 3);
  ext.hysteresis = GENERATE(1, 2, 4);
  ext.consecutive_hysteresis = GENERATE(false, true);
  ext.min_scale = GENERATE(0.0, 3.0);
  ext.max_scale = GENERATE(std::numeric_limits<double>::infinity(), 300.0);
  const bool with_counters = GENERATE(true, false);
  // 0-dim state, as GradScaler keeps it, on both devices.
  const auto make = [&](torch::Device device) {
    return std::vector<torch::Tensor>{
        torch::full({}, 64.0f, on(torch::kFloat, device)),
        torch::zeros({}, on(torch::kInt, device)),
        torch::full({}, static_cast<int>(ext.hysteresis), on(torch::kInt, device)),
        torch::zeros({3}, on(torch::kLong, device))};
  };
  auto gpu = make(kCuda), cpu = make(torch::kCPU);
  const auto counters = [&](std::vector<torch::Tensor>& s) {
    return with_counters ? std::optional<torch::Tensor>(s[3]) : std::nullopt;
  };
  for (int step = 0; step < 60; ++step) {
    const float r = torch::rand({1}).item<float>();
    const float f = r < 0.05f ? kNaN : (r < 0.4f ? 1.0f : 0.0f);
    amp::update_scale_(gpu[0], gpu[1], torch::full({}, f, on(torch::kFloat)), 2.0, 0.5, interval,
                       gpu[2], counters(gpu), ext);
    amp::update_scale_(cpu[0], cpu[1], torch::full({}, f), 2.0, 0.5, interval, cpu[2],
                       counters(cpu), ext);
    INFO("step " << step << " found " << f);
    REQUIRE(same_bits(gpu[0].cpu(), cpu[0]));
    REQUIRE(torch::equal(gpu[1].cpu(), cpu[1]));
    REQUIRE(torch::equal(gpu[2].cpu(), cpu[2]));
    REQUIRE(torch::equal(gpu[3].cpu(), cpu[3]));
  }
}

TEST_CASE("The CUDA extended update matches the tensor-op reference of the rule", "[ops][cuda]") {
  torch::manual_seed(22);
  amp_test::UpdateOptions o;
  o.growth_interval = GENERATE(1, 3);
  o.hysteresis = GENERATE(1, 2);
  o.consecutive_hysteresis = GENERATE(false, true);
  o.min_scale = GENERATE(0.0, 3.0);
  o.max_scale = GENERATE(std::numeric_limits<double>::infinity(), 300.0);
  amp_test::require_random_updates_match_reference(o, 40, kCuda);
}

TEST_CASE("The CUDA norm is bit-identical run to run and rounds the exact norm", "[ops][cuda]") {
  torch::manual_seed(18);
  // x = M * 2^-23 with integer M < 2^23: every square is an exact multiple of 2^-46, so the
  // exact sum of squares S is an integer count of 2^-46, summed below without rounding. A few
  // extra values then make S exactly m^2, where m is the midpoint between two adjacent float32
  // values: the exact norm is a tie, and which float32 comes out depends on the last bits of the
  // float64 sum, that is on the order of its additions. A reduction whose order changes from run
  // to run (atomics) then returns different floats; a fixed order returns one.
  using u128 = unsigned __int128;
  const int64_t rows = kCudaLimits.max_blocks + 428;  // one block per row: two launches
  const int64_t numel = rows * kChunk;
  auto m_int = torch::randint(0, int64_t{1} << 23, {numel}, on(torch::kLong));
  const auto row_sums = (m_int * m_int).view({rows, kChunk}).sum(1).cpu();  // each < 2^62
  u128 s = 0;
  for (int64_t r = 0; r < rows; ++r) s += static_cast<u128>(row_sums[r].item<int64_t>());
  const auto flat = m_int.to(torch::kFloat).mul_(std::ldexp(1.0f, -23));  // exact
  m_int = torch::Tensor();

  const auto units = [](float f) { return static_cast<u128>(std::ldexp(double{f}, 23)); };
  const long double root = std::sqrt(static_cast<long double>(s)) / 8388608.0L;
  float lo = static_cast<float>(root);
  if (static_cast<long double>(lo) > root) lo = std::nextafter(lo, 0.0f);
  float hi = std::nextafter(lo, kInf);
  u128 mid = (units(lo) + units(hi)) / 2;  // in units of 2^-23
  while (mid * mid < s) {
    lo = hi;
    hi = std::nextafter(hi, kInf);
    mid = (units(lo) + units(hi)) / 2;
  }
  u128 rest = mid * mid - s;
  std::vector<float> extras;
  while (rest > 0) {
    auto k = static_cast<u128>(std::sqrt(static_cast<long double>(rest)));
    while (k * k > rest) --k;
    while ((k + 1) * (k + 1) <= rest) ++k;
    k = std::min<u128>(k, (u128{1} << 24) - 1);  // k * 2^-23 stays an exact float32
    rest -= k * k;
    extras.push_back(std::ldexp(static_cast<float>(static_cast<uint64_t>(k)), -23));
  }
  REQUIRE(extras.size() < 64);

  // Slices of the flat buffer (one starts unaligned) plus the extras: several tensors, more
  // blocks than one launch holds.
  const int64_t third = rows / 3;
  const std::vector<int64_t> cuts = {0, third * kChunk + 4, third * kChunk + 781,
                                     2 * third * kChunk + 1, numel};
  std::vector<torch::Tensor> grads;
  std::vector<int64_t> numels;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    grads.push_back(flat.narrow(0, cuts[i], cuts[i + 1] - cuts[i]));
    numels.push_back(cuts[i + 1] - cuts[i]);
  }
  grads.push_back(torch::tensor(extras).to(kCuda));
  numels.push_back(static_cast<int64_t>(extras.size()));
  REQUIRE(amp::kernels::plan_launches(numels, kCudaLimits).size() >= 2);

  // inv_scale 1/8 keeps every product exact and the tie a tie (at m / 8).
  const auto inv = scalar(0.125f);
  std::vector<float> totals;
  std::vector<torch::Tensor> pers;
  for (int run = 0; run < 10; ++run) {
    auto found = zero_flag();
    auto [total, per] = amp::unscale_norm(grads, found, inv, true);
    CHECK(found.item<float>() == 0.0f);
    totals.push_back(total.item<float>());
    pers.push_back(per.cpu());
  }
  std::ostringstream seen;
  for (float t : totals) seen << std::hexfloat << t << ' ';
  INFO("lo/8 " << std::hexfloat << lo / 8 << " hi/8 " << hi / 8 << " runs " << seen.str());
  CHECK((totals[0] == lo / 8 || totals[0] == hi / 8));
  for (size_t run = 1; run < totals.size(); ++run) {
    CHECK(float_bits(totals[run]) == float_bits(totals[0]));
    CHECK(torch::equal(raw_bits(pers[run]), raw_bits(pers[0])));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("tensor " << i);
    CHECK(rounds_to(pers[0][i].item<float>(), reference_norm({grads[i]}, 0.125)));
  }
}

TEST_CASE("CUDA ops check and unscale float64 in float64: finite values above FLT_MAX pass",
          "[ops][cuda]") {
  torch::manual_seed(19);
  constexpr float kInv = 1.0f / 65536.0f;
  // Finite float64 values a float32 cannot hold: a check in float32 would call them inf.
  auto big = torch::randn({70001}, on(torch::kDouble)).mul_(1.0e300);
  big[0] = 1.0e39;
  big[65536] = -3.5e38;
  big[70000] = std::numeric_limits<double>::max();
  std::vector<torch::Tensor> grads = {big, scaled_randn({1000}, torch::kFloat)};
  auto cpu = std::vector<torch::Tensor>{grads[0].cpu(), grads[1].cpu()};
  const auto before = grads[0].cpu();

  auto found = zero_flag(), found_cpu = zero_flag(torch::kCPU);
  amp::non_finite_check_and_unscale_(grads, found, scalar(kInv));
  for (auto& g : cpu) {
    at::_amp_foreach_non_finite_check_and_unscale_({g}, found_cpu, scalar(kInv, torch::kCPU));
  }
  CHECK(found.item<float>() == 0.0f);
  CHECK(found_cpu.item<float>() == 0.0f);
  CHECK(same_bits(grads[0].cpu(), cpu[0]));
  CHECK(same_bits(grads[1].cpu(), cpu[1]));
  for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{65536}, int64_t{70000}}) {
    INFO("element " << pos);
    CHECK(grads[0][pos].item<double>() == before[pos].item<double>() * double{kInv});
  }

  // The norm's check too; 1e39 / 65536 squared and summed stays finite in float64.
  auto moderate = torch::full({5000}, 1.0e39, on(torch::kDouble));
  auto found_norm = zero_flag();
  auto [total, unused] = amp::unscale_norm({moderate}, found_norm, scalar(kInv), false);
  CHECK(found_norm.item<float>() == 0.0f);
  CHECK(rounds_to(total.item<float>(), reference_norm({moderate}, kInv)));

  // A float64 inf is still found.
  auto with_inf = big.clone();
  with_inf[5] = std::numeric_limits<double>::infinity();
  auto found_inf = zero_flag();
  amp::non_finite_check_and_unscale_({with_inf}, found_inf, scalar(kInv));
  CHECK(found_inf.item<float>() == 1.0f);
}

namespace {

/// A gradient list of every kind the kernels treat differently: mixed dtypes, a non-dense view
/// (copied inside the op), a two-chunk tensor, and more tensors than one launch holds.
std::vector<torch::Tensor> graph_grads() {
  std::vector<torch::Tensor> grads = {
      scaled_randn({200003}, torch::kFloat), scaled_randn({70001}, torch::kBFloat16),
      scaled_randn({4097}, torch::kHalf), scaled_randn({333}, torch::kDouble),
      scaled_randn({64, 50}, torch::kFloat).narrow(1, 3, 40)};
  for (int i = 0; i < 300; ++i) grads.push_back(scaled_randn({1 + i * 7 % 500}, torch::kFloat));
  return grads;
}

/// New values for the graph's static gradients, NaN in tensor 1 when `overflow`.
std::vector<torch::Tensor> fresh_values(const std::vector<torch::Tensor>& like, bool overflow) {
  std::vector<torch::Tensor> out;
  for (const auto& g : like) out.push_back(scaled_randn(g.sizes(), g.scalar_type()));
  if (overflow) out[1][5] = kNaN;
  return out;
}

}  // namespace

TEST_CASE("Unscale, norm, clip and update captured in a CUDA graph replay as eager calls",
          "[ops][cuda]") {
  torch::manual_seed(17);
  constexpr double kMaxNorm = 1.0;
  auto grads = graph_grads();
  auto scale = torch::full({}, 65536.0f, on(torch::kFloat));
  auto tracker = torch::zeros({}, on(torch::kInt));
  auto found = torch::zeros({}, on(torch::kFloat));
  const auto step = [&](std::vector<torch::Tensor>& g, torch::Tensor& s, torch::Tensor& t,
                        torch::Tensor& f) {
    f.zero_();
    const auto inv = s.to(torch::kDouble).reciprocal().to(torch::kFloat);
    auto [total, per] = amp::unscale_norm(g, f, inv, true);
    amp::clip_unscaled_(g, inv, total, kMaxNorm);
    amp::update_scale_(s, t, f, 2.0, 0.5, 2);
    return std::make_pair(total, per);
  };

  const auto side = c10::cuda::getStreamFromPool();
  torch::cuda::synchronize();  // the pool stream does not wait for the default stream's writes
  {
    // Warm-up on the capture stream, on throw-away copies of the state.
    const c10::cuda::CUDAStreamGuard guard(side);
    auto g = clones(grads);
    auto s = scale.clone(), t = tracker.clone(), f = found.clone();
    step(g, s, t, f);
  }
  torch::cuda::synchronize();
  at::cuda::CUDAGraph graph;
  torch::Tensor graph_total, graph_per;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    std::tie(graph_total, graph_per) = step(grads, scale, tracker, found);
    graph.capture_end();
  }
  torch::cuda::synchronize();

  auto eager_scale = scale.clone(), eager_tracker = tracker.clone(), eager_found = found.clone();
  auto aten_scale = scale.clone(), aten_tracker = tracker.clone();
  for (int replay = 0; replay < 6; ++replay) {
    const bool overflow = replay == 2 || replay == 3;
    INFO("replay " << replay << (overflow ? " (overflow)" : ""));
    const auto values = fresh_values(grads, overflow);
    for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(values[i]);
    auto eager = clones(values);
    graph.replay();
    auto [eager_total, eager_per] = step(eager, eager_scale, eager_tracker, eager_found);
    at::_amp_update_scale_(aten_scale, aten_tracker, eager_found, 2.0, 0.5, 2);
    torch::cuda::synchronize();
    CHECK(found.item<float>() == (overflow ? 1.0f : 0.0f));
    CHECK(same_bits(found, eager_found));
    CHECK(same_bits(graph_total, eager_total));
    CHECK(same_bits(graph_per, eager_per));
    CHECK(failing(static_cast<int64_t>(grads.size()),
                  [&](int64_t i) { return same_bits(grads[i], eager[i]); }) == "");
    CHECK(same_bits(scale, eager_scale));
    CHECK(torch::equal(tracker, eager_tracker));
    CHECK(same_bits(scale, aten_scale));
    CHECK(torch::equal(tracker, aten_tracker));
  }
  // The replays followed the live scale: 65536, 131072, 65536, 32768, 32768, 65536.
  CHECK(scale.item<float>() == 65536.0f);
  CHECK(tracker.item<int>() == 0);
}

TEST_CASE("Unscaling with attribution captured in a CUDA graph matches ATen's eager op",
          "[ops][cuda]") {
  torch::manual_seed(20);
  auto grads = graph_grads();
  auto found = zero_flag();
  auto inv = scalar(1.0f / 1024.0f);
  auto flags = torch::zeros({static_cast<int64_t>(grads.size())}, on(torch::kFloat));
  const auto side = c10::cuda::getStreamFromPool();
  torch::cuda::synchronize();  // the pool stream does not wait for the default stream's writes
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    auto g = clones(grads);
    auto f = found.clone(), fl = flags.clone();
    amp::non_finite_check_and_unscale_(g, f, inv, fl);
  }
  torch::cuda::synchronize();
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    found.zero_();
    flags.zero_();
    amp::non_finite_check_and_unscale_(grads, found, inv, flags);
    graph.capture_end();
  }
  torch::cuda::synchronize();
  for (int replay = 0; replay < 5; ++replay) {
    const bool overflow = replay % 2 == 1;
    INFO("replay " << replay);
    const auto values = fresh_values(grads, overflow);
    for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(values[i]);
    inv.fill_(1.0f / static_cast<float>(1 << (replay + 3)));  // read on the device at replay
    auto expected = clones(values);
    auto found_ref = zero_flag();
    graph.replay();
    aten_unscale(expected, found_ref, inv);
    torch::cuda::synchronize();
    CHECK(found.item<float>() == (overflow ? 1.0f : 0.0f));
    CHECK(found_ref.item<float>() == found.item<float>());
    CHECK(flags.nonzero().flatten().cpu().equal(overflow ? torch::tensor({int64_t{1}})
                                                         : torch::empty({0}, torch::kLong)));
    CHECK(failing(static_cast<int64_t>(grads.size()),
                  [&](int64_t i) { return same_bits(grads[i], expected[i]); }) == "");
  }
}
