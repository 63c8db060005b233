// The fused float8 casts (fused_cast.h): the ATen side (2-d views, output layouts, scale shapes,
// the delayed cast's bookkeeping) and the CPU kernels, which run cast_element.h's arithmetic in
// the CUDA kernels' order of work (tiles for the cast, keys for the amax).
#include "fp8/fused_cast.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include "kernels/dtype_of.h"

namespace amp::fp8::detail {
namespace {

using cast_element::Format;
using cast_element::MatrixView;
using cast_element::ScaleAxis;
using cast_element::TileGrid;

Format format_of(c10::ScalarType fp8_dtype) {
  switch (fp8_dtype) {
    case c10::ScalarType::Float8_e4m3fn:
      return Format::kE4M3;
    case c10::ScalarType::Float8_e5m2:
      return Format::kE5M2;
    default:
      TORCH_CHECK(false, "amp::fp8: dtype must be Float8_e4m3fn or Float8_e5m2. Got ", fp8_dtype,
                  ".");
  }
}

MatrixView view_of(const at::Tensor& t) {
  return MatrixView{t.storage_offset(), t.stride(0), t.stride(1)};
}

// ---- CPU kernels ----

template <typename T>
float load(const T* data, int64_t index) {
  return static_cast<float>(data[index]);
}

// Calls fn(T-typed pointer) for x's dtype.
template <typename Fn>
void with_input_type(const at::Tensor& x, const Fn& fn) {
  const auto dtype = kernels::dtype_of(x.scalar_type());
  TORCH_CHECK(dtype && *dtype != kernels::Dtype::kDouble,
              "amp::fp8: a float8 cast reads float32, bfloat16 or float16 tensors, not ",
              x.scalar_type(), ".");
  switch (*dtype) {
    case kernels::Dtype::kFloat:
      return fn(static_cast<const float*>(x.storage().data()));
    case kernels::Dtype::kBFloat16:
      return fn(static_cast<const c10::BFloat16*>(x.storage().data()));
    case kernels::Dtype::kHalf:
    default:
      return fn(static_cast<const c10::Half*>(x.storage().data()));
  }
}

uint32_t key_of(float value, bool ignore_nan) {
  return ignore_nan ? cast_element::amax_key_ignoring_nan(value) : cast_element::amax_key(value);
}

void amax_cpu(const at::Tensor& x, ScaleAxis axis, bool ignore_nan, const at::Tensor& keys) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const MatrixView view = view_of(x);
  auto* out = reinterpret_cast<uint32_t*>(keys.data_ptr<int32_t>());
  with_input_type(x, [&](const auto* data) {
    switch (axis) {
      case ScaleAxis::kTensor: {
        std::vector<uint32_t> partial(at::get_num_threads(), 0u);
        at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(cols, 1)),
                         [&](int64_t begin, int64_t end) {
                           uint32_t key = 0;
                           for (int64_t r = begin; r < end; ++r) {
                             for (int64_t c = 0; c < cols; ++c) {
                               key = std::max(key, key_of(load(data, view.at(r, c)), ignore_nan));
                             }
                           }
                           auto& slot = partial[at::get_thread_num()];
                           slot = std::max(slot, key);
                         });
        out[0] = *std::max_element(partial.begin(), partial.end());
        break;
      }
      case ScaleAxis::kRow:
        at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            uint32_t key = 0;
            for (int64_t c = 0; c < cols; ++c) {
              key = std::max(key, key_of(load(data, view.at(r, c)), ignore_nan));
            }
            out[r] = key;
          }
        });
        break;
      case ScaleAxis::kColumn:
        // Columns in blocks of one tile width, each block walking every row.
        at::parallel_for(0, (cols + cast_element::kTile - 1) / cast_element::kTile, 1,
                         [&](int64_t begin, int64_t end) {
                           for (int64_t block = begin; block < end; ++block) {
                             const int64_t c0 = block * cast_element::kTile;
                             const int64_t c1 = std::min(cols, c0 + cast_element::kTile);
                             for (int64_t c = c0; c < c1; ++c) out[c] = 0;
                             for (int64_t r = 0; r < rows; ++r) {
                               for (int64_t c = c0; c < c1; ++c) {
                                 out[c] = std::max(out[c],
                                                   key_of(load(data, view.at(r, c)), ignore_nan));
                               }
                             }
                           }
                         });
        break;
    }
  });
}

void scale_cpu(const at::Tensor& keys, Format format, bool power_of_2, const at::Tensor& scale) {
  const auto* in = reinterpret_cast<const uint32_t*>(keys.data_ptr<int32_t>());
  auto* out = scale.data_ptr<float>();
  for (int64_t i = 0; i < keys.numel(); ++i) {
    out[i] = cast_element::scale_from_amax(cast_element::key_amax(in[i]), format, power_of_2);
  }
}

// A tile is read and written along each tensor's contiguous dim (a tile's 32 rows of a
// column-major copy, written a column at a time, are 32 lines a power-of-two stride apart: they
// share a few cache sets and evict each other). So each thread stages its tile's float8 bits in a
// local tile, as each CUDA block stages its tile in shared memory.
using Tile = uint8_t[cast_element::kTile][cast_element::kTile];

// Whether a view's contiguous dim is its first (a column-major copy).
bool columns_contiguous(const MatrixView& view) {
  return view.row_stride == 1 && view.col_stride != 1;
}

void store_tile(const Tile& tile, uint8_t* dst, const MatrixView& view, int64_t r0, int64_t c0,
                int64_t height, int64_t width) {
  if (columns_contiguous(view)) {
    for (int64_t j = 0; j < width; ++j) {
      uint8_t* column = dst + view.at(r0, c0 + j);
      for (int64_t i = 0; i < height; ++i) column[i] = tile[i][j];
    }
    return;
  }
  for (int64_t i = 0; i < height; ++i) {
    uint8_t* row = dst + view.at(r0 + i, c0);
    for (int64_t j = 0; j < width; ++j) row[j * view.col_stride] = tile[i][j];
  }
}

// One thread's tiles of the cast; the choices fixed for a call (scale axis, format, amax) are
// template parameters. Returns the NaN-ignoring amax key of what it read.
template <ScaleAxis kAxis, Format kFormat, bool kAmax, typename T>
uint32_t quantize_tiles(const T* src, const MatrixView& in, uint8_t* out_data,
                        const MatrixView& out, uint8_t* alt_data, const MatrixView& alt,
                        const float* scales, const TileGrid& grid, int64_t begin, int64_t end) {
  uint32_t key = 0;
  Tile tile;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t r0 = grid.row0(t), c0 = grid.col0(t);
    const int64_t height = grid.height(t), width = grid.width(t);
    const auto element = [&](int64_t i, int64_t j, const T& x) {
      const float value = static_cast<float>(x);
      const float s = kAxis == ScaleAxis::kTensor ? scales[0]
                      : kAxis == ScaleAxis::kRow  ? scales[r0 + i]
                                                  : scales[c0 + j];
      tile[i][j] = cast_element::quantize(value, s, kFormat);
      if constexpr (kAmax) key = std::max(key, cast_element::amax_key_ignoring_nan(value));
    };
    if (columns_contiguous(in)) {
      for (int64_t j = 0; j < width; ++j) {
        const T* column = src + in.at(r0, c0 + j);
        for (int64_t i = 0; i < height; ++i) element(i, j, column[i]);
      }
    } else {
      for (int64_t i = 0; i < height; ++i) {
        const T* row = src + in.at(r0 + i, c0);
        for (int64_t j = 0; j < width; ++j) element(i, j, row[j * in.col_stride]);
      }
    }
    store_tile(tile, out_data, out, r0, c0, height, width);
    if (alt_data != nullptr) store_tile(tile, alt_data, alt, r0, c0, height, width);
  }
  return key;
}

// Calls fn(std::true_type{}) or fn(std::false_type{}): a run-time flag as a template argument.
template <typename Fn>
auto with_flag(bool flag, const Fn& fn) {
  return flag ? fn(std::true_type{}) : fn(std::false_type{});
}

void quantize_cpu(const at::Tensor& x, const at::Tensor& scale, ScaleAxis axis, Format format,
                  const at::Tensor& data, const at::Tensor& alternate,
                  const at::Tensor& amax_keys) {
  const TileGrid grid{x.size(0), x.size(1)};
  const MatrixView in = view_of(x);
  const MatrixView out = view_of(data);
  const bool two = alternate.defined();
  const MatrixView alt = two ? view_of(alternate) : MatrixView{0, 0, 0};
  auto* out_data = static_cast<uint8_t*>(data.storage().mutable_data());
  auto* alt_data = two ? static_cast<uint8_t*>(alternate.storage().mutable_data()) : nullptr;
  const float* scales = scale.data_ptr<float>();
  const bool with_amax = amax_keys.defined();
  std::vector<uint32_t> partial(at::get_num_threads(), 0u);
  with_input_type(x, [&](const auto* src) {
    with_flag(with_amax, [&](auto kAmax) {
      with_flag(format == Format::kE4M3, [&](auto kE4M3) {
        constexpr Format kFormat = kE4M3 ? Format::kE4M3 : Format::kE5M2;
        const auto tiles = [&](auto kAxis) {
          at::parallel_for(0, grid.tiles(), 16, [&](int64_t begin, int64_t end) {
            const uint32_t key = quantize_tiles<decltype(kAxis)::value, kFormat, kAmax>(
                src, in, out_data, out, alt_data, alt, scales, grid, begin, end);
            auto& slot = partial[at::get_thread_num()];
            slot = std::max(slot, key);
          });
        };
        switch (axis) {
          case ScaleAxis::kTensor:
            return tiles(std::integral_constant<ScaleAxis, ScaleAxis::kTensor>{});
          case ScaleAxis::kRow:
            return tiles(std::integral_constant<ScaleAxis, ScaleAxis::kRow>{});
          case ScaleAxis::kColumn:
            return tiles(std::integral_constant<ScaleAxis, ScaleAxis::kColumn>{});
        }
      });
    });
  });
  if (with_amax) {
    reinterpret_cast<uint32_t*>(amax_keys.data_ptr<int32_t>())[0] =
        *std::max_element(partial.begin(), partial.end());
  }
}

// ---- the ATen side ----

// x as the kernels read it: [rows, last dim] (a view unless a permuted N-d input must be copied,
// as torchao's reshape does later).
at::Tensor as_2d(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, "amp::fp8: a float8 cast needs a tensor of at least one dim.");
  return x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
}

bool column_major(const at::Tensor& t) {
  return t.size(0) > 1 && t.size(1) > 1 && t.stride(0) == 1 && t.stride(1) >= t.size(0);
}

// A float8 [rows, cols] tensor, row-major or column-major.
at::Tensor empty_fp8(const at::Tensor& like, c10::ScalarType fp8_dtype, bool col_major) {
  const auto options = like.options().dtype(fp8_dtype);
  const int64_t rows = like.size(0), cols = like.size(1);
  return col_major ? at::empty({cols, rows}, options).t() : at::empty({rows, cols}, options);
}

// The outputs `layouts` asks for: {data, alternate}.
std::pair<at::Tensor, at::Tensor> allocate(const at::Tensor& x2, c10::ScalarType fp8_dtype,
                                           Layouts layouts) {
  const bool same_col = column_major(x2);
  switch (layouts) {
    case Layouts::kSame:
      return {empty_fp8(x2, fp8_dtype, same_col), at::Tensor()};
    case Layouts::kOther:
      return {empty_fp8(x2, fp8_dtype, !same_col), at::Tensor()};
    case Layouts::kBoth:
      return {empty_fp8(x2, fp8_dtype, same_col), empty_fp8(x2, fp8_dtype, !same_col)};
  }
  return {};
}

void check_input(const at::Tensor& x2) {
  TORCH_CHECK(x2.scalar_type() == at::kFloat || x2.scalar_type() == at::kBFloat16 ||
                  x2.scalar_type() == at::kHalf,
              "amp::fp8: a float8 cast reads float32, bfloat16 or float16 tensors, not ",
              x2.scalar_type(), ".");
}

}  // namespace

amp::kernels::DeviceDispatch<kernels_api::AmaxFn> fused_amax_kernel("the fused float8 amax",
                                                                    &amax_cpu);
amp::kernels::DeviceDispatch<kernels_api::ScaleFn> fused_scale_kernel("the fused float8 scale",
                                                                      &scale_cpu);
amp::kernels::DeviceDispatch<kernels_api::QuantizeFn> fused_quantize_kernel("the fused float8 cast",
                                                                            &quantize_cpu);

Float8Operand fused_cast_dynamic(const at::Tensor& x, const CastConfig& config, int64_t axis,
                                 bool power_of_2, Layouts layouts) {
  const auto x2 = as_2d(x);
  check_input(x2);
  const auto device = x2.device().type();
  const int64_t rows = x2.size(0), cols = x2.size(1);
  const bool rowwise = config.granularity == Granularity::rowwise;
  const ScaleAxis scale_axis =
      !rowwise ? ScaleAxis::kTensor : (axis == 0 ? ScaleAxis::kColumn : ScaleAxis::kRow);
  const int64_t count = scale_axis == ScaleAxis::kTensor ? 1
                        : scale_axis == ScaleAxis::kRow  ? rows
                                                         : cols;
  const auto format = format_of(config.dtype);
  auto keys = at::zeros({count}, x2.options().dtype(at::kInt));
  auto scale = at::empty({count}, x2.options().dtype(at::kFloat));
  auto [data, alternate] = allocate(x2, config.dtype, layouts);
  if (x2.numel() > 0) {
    fused_amax_kernel[device](x2, scale_axis, /*ignore_nan=*/false, keys);
  }
  fused_scale_kernel[device](keys, format, power_of_2, scale);
  if (x2.numel() > 0) {
    fused_quantize_kernel[device](x2, scale, scale_axis, format, data, alternate, at::Tensor());
  }
  // The eager cast's scale shapes: 0-dim, or the amax's keepdim shape of the 2-d view.
  const auto shaped = scale_axis == ScaleAxis::kTensor ? scale.reshape({})
                      : scale_axis == ScaleAxis::kRow  ? scale.reshape({rows, 1})
                                                       : scale.reshape({1, cols});
  Float8Operand out{data, shaped, x.scalar_type(), std::nullopt, {}};
  if (rowwise) out.axiswise_dim = axis;
  out.alternate = alternate;
  return out;
}

Float8Operand fused_cast_delayed(const at::Tensor& x, c10::ScalarType fp8_dtype,
                                 DelayedState& state, const DelayedScalingOptions& options,
                                 Layouts layouts) {
  const auto x2 = as_2d(x);
  check_input(x2);
  const auto device = x2.device().type();
  const auto [scale, replayed] = delayed_cast_scale(state);
  auto [data, alternate] = allocate(x2, fp8_dtype, layouts);
  // NaN-ignoring keys are the bits of a float32 amax (never a NaN): the amax is a view of them.
  auto keys = replayed ? at::Tensor() : at::zeros({1}, x2.options().dtype(at::kInt));
  if (x2.numel() > 0) {
    fused_quantize_kernel[device](x2, scale.reshape({1}), ScaleAxis::kTensor, format_of(fp8_dtype),
                                  data, alternate, keys);
  }
  Float8Operand out{data, scale, x.scalar_type(), std::nullopt, {}};
  out.alternate = alternate;
  if (!replayed) record_delayed_amax(state, keys.view(at::kFloat).reshape({}), fp8_dtype, options);
  return out;
}

}  // namespace amp::fp8::detail
