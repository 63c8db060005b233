// amp_check_4gib IN OUT: the C++ side of scripts/check-4gib. Reads Python's torch.save file IN
// (over 4 GiB, so ZIP64) with amp::load_pickled and checks its values, writes them to OUT with
// amp::save_pickled, reads OUT back and checks again; prints the peak resident memory after each
// step. Exits 0 when every value is as the script wrote it.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include <ATen/ATen.h>

#include <amp/state_dict.h>

namespace {

// {"big": 1.1e9 float32 values, 1.5 but big[0] = -1 and big[-1] = 2; "small": 0..4}.
bool has_the_values(const c10::IValue& value, const char* what) {
  const at::Tensor big = amp::dict_entry(value, "big").toTensor();
  const at::Tensor small = amp::dict_entry(value, "small").toTensor();
  const int64_t n = 1'100'000'000;
  bool ok = big.scalar_type() == at::kFloat && big.dim() == 1 && big.size(0) == n &&
            big[0].item<float>() == -1.0f && big[n - 1].item<float>() == 2.0f &&
            at::equal(small, at::arange(5, at::kFloat));
  // The middle in slices, so that the check's own temporaries stay small next to the tensor.
  constexpr int64_t kSlice = 100'000'000;
  for (int64_t at = 1; ok && at < n - 1; at += kSlice) {
    ok = big.slice(0, at, std::min(at + kSlice, n - 1)).eq(1.5f).all().item<bool>();
  }
  std::printf("amp_check_4gib: %s: %s\n", what, ok ? "the values are the script's" : "WRONG");
  return ok;
}

void print_peak(const char* after) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("amp_check_4gib: peak resident memory after %s: %.2f GiB\n", after,
              static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: amp_check_4gib IN OUT\n");
    return 2;
  }
  bool ok = true;
  {
    const c10::IValue read = amp::load_pickled(argv[1]);
    print_peak("load_pickled(IN)");
    ok = has_the_values(read, "Python's file") && ok;
    amp::save_pickled(read, argv[2]);
    print_peak("save_pickled(OUT)");
  }
  ok = has_the_values(amp::load_pickled(argv[2]), "amp's file read back") && ok;
  print_peak("load_pickled(OUT)");
  return ok ? 0 : 1;
}
