// The examples' option parsing: both option spellings, --help, and each kind of bad command line.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.h"

namespace {

using amp_examples::UsageError;
using Catch::Contains;

struct Parsed {
  std::int64_t epochs = 5;
  std::string data = "default";
  int verbose = 0;
};

amp_examples::CommandLine make_cli(Parsed& parsed) {
  amp_examples::CommandLine cli("prog", "Does a thing.");
  cli.add_option("epochs", "N", "passes (default 5)", [&](std::string_view value) {
    parsed.epochs = amp_examples::parse_integer("--epochs", value, 1, 100);
  });
  cli.add_option("data", "DIR", "where the data is",
                 [&](std::string_view value) { parsed.data = std::string(value); });
  cli.add_flag("verbose", "say more", [&] { ++parsed.verbose; });
  return cli;
}

bool parse(const amp_examples::CommandLine& cli, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  return cli.parse(static_cast<int>(args.size()), args.data());
}

}  // namespace

TEST_CASE("Options are accepted as --name VALUE and --name=VALUE, the last one winning",
          "[examples]") {
  Parsed parsed;
  const auto cli = make_cli(parsed);
  CHECK(parse(cli, {}));
  CHECK(parsed.epochs == 5);
  CHECK(parse(cli, {"--epochs", "7", "--data=/a=b"}));
  CHECK(parsed.epochs == 7);
  CHECK(parsed.data == "/a=b");
  CHECK(parse(cli, {"--epochs=2", "--epochs", "3"}));
  CHECK(parsed.epochs == 3);
}

TEST_CASE("A flag is written alone, between options, and takes no value", "[examples]") {
  Parsed parsed;
  const auto cli = make_cli(parsed);
  CHECK(parse(cli, {"--verbose", "--epochs", "4", "--verbose"}));
  CHECK(parsed.verbose == 2);
  CHECK(parsed.epochs == 4);
  CHECK_THROWS_WITH(parse(cli, {"--verbose=1"}),
                    "option --verbose is a flag and takes no value; write --verbose alone");
}

// (The name must not start with "--": ctest passes it to the test binary, which would read it as
// its own --help and exit 0 without running the case.)
TEST_CASE(
    "The usage text: asked for by --help and -h instead of a run, one aligned line per option",
    "[examples]") {
  Parsed parsed;
  const auto cli = make_cli(parsed);
  CHECK_FALSE(parse(cli, {"--help"}));
  CHECK_FALSE(parse(cli, {"--epochs", "2", "-h"}));
  const std::string usage = cli.usage();
  CHECK_THAT(usage, Contains("usage: prog [--help] [--epochs N] [--data DIR] [--verbose]"));
  CHECK_THAT(usage, Contains("Does a thing."));
  // The first column is as wide as the widest spelling ("-h, --help", "--epochs N", "--data DIR").
  CHECK_THAT(usage, Contains("\n  -h, --help  show this help and exit\n"));
  CHECK_THAT(usage, Contains("\n  --epochs N  passes (default 5)\n"));
  CHECK_THAT(usage, Contains("\n  --verbose   say more\n"));
}

TEST_CASE("Unknown options, stray arguments and missing values are usage errors", "[examples]") {
  Parsed parsed;
  const auto cli = make_cli(parsed);
  CHECK_THROWS_MATCHES(parse(cli, {"--epoch", "3"}), UsageError,
                       Catch::Matchers::Message("unknown option '--epoch'"));
  CHECK_THROWS_WITH(parse(cli, {"--epochs=3", "--bogus=1"}), "unknown option '--bogus'");
  CHECK_THROWS_WITH(parse(cli, {"data"}),
                    "unexpected argument 'data'; options are written --name VALUE");
  CHECK_THROWS_WITH(parse(cli, {"--"}), Contains("unexpected argument '--'"));
  CHECK_THROWS_WITH(parse(cli, {"--data"}), "option --data needs a value (DIR)");
  CHECK_THROWS_WITH(parse(cli, {"--epochs", "0"}),
                    "--epochs must be a whole number from 1 to 100, not '0'");
}

TEST_CASE("Integers must be whole, in range and nothing else", "[examples]") {
  CHECK(amp_examples::parse_integer("--n", "42", 0, 100) == 42);
  CHECK(amp_examples::parse_integer("--n", "0", 0, 100) == 0);
  for (const char* bad : {"", "4.5", "3x", "-1", "101", " 7", "99999999999999999999"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(amp_examples::parse_integer("--n", bad, 0, 100),
                      "--n must be a whole number from 0 to 100, not '" + std::string(bad) + "'");
  }
}

TEST_CASE("Positive numbers must be finite and above zero", "[examples]") {
  CHECK(amp_examples::parse_positive_number("--lr", "0.01") == 0.01);
  CHECK(amp_examples::parse_positive_number("--lr", "1e-3") == 0.001);
  for (const char* bad : {"0", "-0.5", "nan", "inf", "", "0.1.2", "abc"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(
        amp_examples::parse_positive_number("--lr", bad),
        "--lr must be a finite number greater than 0, not '" + std::string(bad) + "'");
  }
}

TEST_CASE("A choice is one of the listed words, named in the error otherwise", "[examples]") {
  const std::vector<std::string_view> choices = {"fp32", "bf16"};
  CHECK(amp_examples::parse_choice("--precision", "bf16", choices) == 1);
  CHECK(amp_examples::parse_choice("--precision", "fp32", choices) == 0);
  CHECK_THROWS_WITH(amp_examples::parse_choice("--precision", "BF16", choices),
                    "--precision must be one of fp32, bf16, not 'BF16'");
}

TEST_CASE("Number options show their default and store what is given", "[examples]") {
  std::int64_t epochs = 5;
  std::int64_t warmup = 100;
  double lr = 0.01;
  amp_examples::CommandLine cli("prog", "Trains.");
  cli.add_integer_option("epochs", "N", "passes over the data", epochs, 1);
  cli.add_integer_option("warmup", "N", "warmup steps", warmup, 0);
  cli.add_positive_option("lr", "RATE", "learning rate", lr);
  const std::string usage = cli.usage();
  CHECK_THAT(usage, Contains("--epochs N  passes over the data (default 5)"));
  CHECK_THAT(usage, Contains("--warmup N  warmup steps (default 100)"));
  CHECK_THAT(usage, Contains("--lr RATE   learning rate (default 0.01)"));

  CHECK(parse(cli, {"--epochs", "7", "--warmup=0", "--lr", "1e-3"}));
  CHECK(epochs == 7);
  CHECK(warmup == 0);
  CHECK(lr == 0.001);
  CHECK_THROWS_WITH(parse(cli, {"--epochs", "0"}),
                    "--epochs must be a whole number from 1 to 9223372036854775807, not '0'");
  CHECK_THROWS_WITH(parse(cli, {"--warmup", "-1"}),
                    "--warmup must be a whole number from 0 to 9223372036854775807, not '-1'");
  CHECK_THROWS_WITH(parse(cli, {"--lr", "0"}),
                    "--lr must be a finite number greater than 0, not '0'");
  CHECK(cli.program() == "prog");
}

namespace {

struct Optimizer {
  std::string_view name;
  bool fused;
};
constexpr std::array kOptimizers = {Optimizer{"adamw", false}, Optimizer{"fused-adamw", true}};

}  // namespace

TEST_CASE("A choice option lists its names, shows its default and stores the chosen entry",
          "[examples]") {
  Optimizer optimizer = kOptimizers[0];
  amp_examples::CommandLine cli("prog", "Trains.");
  cli.add_choice_option("optimizer", "the optimizer", kOptimizers, optimizer);
  CHECK_THAT(cli.usage(), Contains("[--optimizer {adamw,fused-adamw}]"));
  CHECK_THAT(cli.usage(),
             Contains("--optimizer {adamw,fused-adamw}  the optimizer (default adamw)"));

  CHECK(parse(cli, {"--optimizer", "fused-adamw"}));
  CHECK(optimizer.name == "fused-adamw");
  CHECK(optimizer.fused);
  CHECK(parse(cli, {"--optimizer=adamw"}));
  CHECK(optimizer.name == "adamw");
  CHECK_FALSE(optimizer.fused);
  CHECK_THROWS_WITH(parse(cli, {"--optimizer", "sgd"}),
                    "--optimizer must be one of adamw, fused-adamw, not 'sgd'");
  CHECK(optimizer.name == "adamw");
}
