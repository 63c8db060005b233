// Downstream program built against the installed amp: a matmul under CPU autocast runs in bf16.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <amp/amp.h>

#include <iostream>

int main() {
  const at::Tensor a = at::ones({4, 4});
  at::Tensor product;
  {
    amp::AutocastGuard autocast(c10::DeviceType::CPU);
    product = at::mm(a, a);
  }
  const bool ok = product.scalar_type() == at::kBFloat16 &&
                  product.to(at::kFloat).equal(at::full({4, 4}, 4.0f)) &&
                  !at::autocast::is_autocast_enabled(c10::DeviceType::CPU) &&
                  amp::version() == AMP_VERSION_STRING;
  std::cout << "amp " << amp::version() << ": mm under CPU autocast gave " << product.scalar_type()
            << (ok ? " as expected\n" : ", expected BFloat16\n");
  return ok ? 0 : 1;
}
