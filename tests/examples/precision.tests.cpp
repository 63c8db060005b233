// The examples' --precision, --device and GradScaler options: what each choice means, the usage
// text, and each refusal's message.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/precision.h"
#include "common/program.h"

namespace {

using amp_examples::UsageError;

bool parse(const amp_examples::CommandLine& cli, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  return cli.parse(static_cast<int>(args.size()), args.data());
}

}  // namespace

TEST_CASE("Each precision names its autocast dtype and whether it scales the loss", "[examples]") {
  const amp_examples::Precision& fp32 = amp_examples::parse_precision("fp32");
  CHECK(fp32.name == "fp32");
  CHECK_FALSE(fp32.autocast_dtype.has_value());
  CHECK_FALSE(fp32.loss_scaling);
  const amp_examples::Precision& bf16 = amp_examples::parse_precision("bf16");
  CHECK(bf16.autocast_dtype == c10::ScalarType::BFloat16);
  CHECK_FALSE(bf16.loss_scaling);
  const amp_examples::Precision& fp16 = amp_examples::parse_precision("fp16");
  CHECK(fp16.autocast_dtype == c10::ScalarType::Half);
  CHECK(fp16.loss_scaling);
  CHECK(fp16.description == "float16 autocast, GradScaler loss scaling");
  CHECK(amp_examples::parse_device("cpu").type == c10::DeviceType::CPU);
  CHECK(amp_examples::parse_device("cuda").type == c10::DeviceType::CUDA);
}

TEST_CASE("An unknown precision or device is refused with the accepted names", "[examples]") {
  CHECK_THROWS_MATCHES(
      amp_examples::parse_precision("fp64"), UsageError,
      Catch::Matchers::Message("--precision must be one of fp32, bf16, fp16, not 'fp64'"));
  // Names are matched exactly, as the usage text spells them.
  CHECK_THROWS_WITH(amp_examples::parse_precision("FP16"),
                    "--precision must be one of fp32, bf16, fp16, not 'FP16'");
  CHECK_THROWS_WITH(amp_examples::parse_precision(""),
                    "--precision must be one of fp32, bf16, fp16, not ''");
  CHECK_THROWS_MATCHES(amp_examples::parse_device("tpu"), UsageError,
                       Catch::Matchers::Message("--device must be one of cpu, cuda, not 'tpu'"));
}

TEST_CASE("The precision, device and GradScaler options parse into their targets", "[examples]") {
  amp_examples::Precision precision = amp_examples::kPrecisions[1];
  amp_examples::DeviceChoice device = amp_examples::kDevices[0];
  amp::GradScalerOptions scaler;
  amp_examples::CommandLine cli("prog", "Trains.");
  amp_examples::add_precision_option(cli, precision);
  amp_examples::add_device_option(cli, device);
  amp_examples::add_init_scale_option(cli, scaler);
  amp_examples::add_growth_interval_option(cli, scaler);

  const std::string usage = cli.usage();
  CHECK_THAT(usage, Catch::Contains("--precision {fp32,bf16,fp16}  forward-pass precision "
                                    "(default bf16)"));
  CHECK_THAT(usage, Catch::Contains("--device {cpu,cuda}           where to train (default cpu)"));
  // torch.amp's defaults: an initial scale of 2^16, doubled after 2000 clean steps.
  CHECK_THAT(usage, Catch::Contains("fp16: GradScaler's initial loss scale (default 65536)"));
  CHECK_THAT(usage,
             Catch::Contains("fp16: clean steps before the loss scale doubles (default 2000)"));

  CHECK(parse(cli, {"--precision", "fp16", "--device=cuda", "--init-scale", "1024",
                    "--growth-interval", "3"}));
  CHECK(precision.name == "fp16");
  CHECK(device.type == c10::DeviceType::CUDA);
  CHECK(scaler.init_scale() == 1024.0);
  CHECK(scaler.growth_interval() == 3);
  CHECK_THROWS_WITH(parse(cli, {"--precision", "half"}),
                    "--precision must be one of fp32, bf16, fp16, not 'half'");
  CHECK_THROWS_WITH(parse(cli, {"--init-scale", "0"}),
                    "--init-scale must be a finite number greater than 0, not '0'");
  CHECK_THROWS_WITH(parse(cli, {"--growth-interval", "0"}),
                    "--growth-interval must be a whole number from 1 to 9223372036854775807, "
                    "not '0'");
}

TEST_CASE("The CPU is always usable", "[examples]") {
  CHECK_NOTHROW(amp_examples::require_device(amp_examples::parse_device("cpu")));
}

TEST_CASE("A CUDA device without a GPU is refused, saying to use the CPU", "[examples][no-gpu]") {
  CHECK_THROWS_MATCHES(
      amp_examples::require_device(amp_examples::parse_device("cuda")), amp_examples::SetupError,
      Catch::Matchers::Message(
          "--device cuda needs a CUDA GPU, but none is available (no GPU or driver on this "
          "machine, or a LibTorch built without CUDA); run on the CPU with --device cpu"));
}

TEST_CASE("A CUDA device is accepted where a GPU is usable", "[examples][cuda]") {
  CHECK_NOTHROW(amp_examples::require_device(amp_examples::parse_device("cuda")));
}

TEST_CASE("The fp8 precision and --fp8-recipe exist only where an example asks for them",
          "[examples]") {
  amp_examples::Precision precision = amp_examples::kPrecisions[1];
  std::string recipe = "tensorwise";
  amp_examples::CommandLine cli("prog", "Trains.");
  amp_examples::add_precision_option(cli, precision, /*float8=*/true);
  amp_examples::add_fp8_recipe_option(cli, recipe);
  CHECK_THAT(cli.usage(), Catch::Contains("--precision {fp32,bf16,fp16,fp8}"));
  CHECK(parse(cli, {"--precision", "fp8", "--fp8-recipe", "delayed"}));
  CHECK(precision.name == "fp8");
  CHECK(precision.float8);
  CHECK(precision.autocast_dtype == c10::ScalarType::BFloat16);
  CHECK(recipe == "delayed");
  CHECK_THROWS_WITH(parse(cli, {"--fp8-recipe", "blockwise"}),
                    Catch::Contains("--fp8-recipe blockwise is not a recipe; use tensorwise, "
                                    "rowwise, rowwise_with_gw_hp or delayed"));
  CHECK_THROWS_WITH(amp_examples::check_fp8_recipe("rowwise", amp_examples::kPrecisions[1]),
                    Catch::Contains("--fp8-recipe rowwise applies to --precision fp8 (got "
                                    "--precision bf16)"));
  CHECK_NOTHROW(amp_examples::check_fp8_recipe("tensorwise", amp_examples::kPrecisions[1]));
  // Without float8, fp8 is not a precision.
  amp_examples::CommandLine plain("prog", "Trains.");
  amp_examples::add_precision_option(plain, precision);
  CHECK_THROWS_WITH(parse(plain, {"--precision", "fp8"}),
                    Catch::Contains("--precision must be one of fp32, bf16, fp16, not 'fp8'"));
}
