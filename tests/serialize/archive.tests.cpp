// The archive checker (src/serialize/archive_check.cpp) and amp::load_archive / amp::load: what
// LibTorch writes passes and loads; inputs that crash, hang or exhaust LibTorch's reader are
// refused with a sentence before it runs.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <amp/archive.h>
#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "serialize/archive_check.h"
#include "serialize/zip_directory.h"
#include "serialize/zip_edit.h"
#include "support/checkpoints.h"

using amp::detail::check_archive_code;
using amp::detail::check_archive_pickle;
using amp::detail::check_archive_type;
using amp_test::edit_entry;
using Catch::Contains;
using namespace std::string_literals;

namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("amp_archive_" + std::to_string(::getpid()) + "_" + name);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

amp::GradScaler cpu_scaler(amp::GradScalerOptions options = {}) {
  return amp::GradScaler(c10::DeviceType::CPU, options);
}

// A pickle from opcodes: PROTO 2, `body`, STOP.
std::string pickle(const std::string& body) { return std::string("\x80\x02", 2) + body + "."; }

const amp::detail::ArchiveRecordSize kNoRecords = [](std::string_view) {
  return std::optional<std::uint64_t>();
};

}  // namespace

TEST_CASE("What LibTorch writes passes the archive check and loads through amp::load",
          "[archive]") {
  const auto scaler =
      cpu_scaler(amp::GradScalerOptions().init_scale(512.0).hysteresis(3).track_counters(true));
  const auto path = temp_path("ok.pt");

  // A scaler alone, read back with amp::load.
  torch::save(scaler, path.string());
  CHECK_NOTHROW(amp::check_archive(path.string()));
  auto loaded = cpu_scaler(amp::GradScalerOptions().track_counters(true));
  amp::load(loaded, path.string());
  CHECK(loaded.get_scale() == 512.0);
  CHECK(loaded.options().hysteresis() == 3);

  // A checkpoint with a nested model, an AdamW state and the scaler.
  write_file(path, amp_test::checkpoint_archive_bytes(scaler));
  torch::serialize::InputArchive archive = amp::load_archive(path.string());
  auto resumed = cpu_scaler();
  archive >> resumed;
  CHECK(resumed.get_scale() == 512.0);
  c10::IValue format;
  REQUIRE(archive.try_read("format", format));
  CHECK(format.toInt() == 3);

  // Tensors of every dtype LibTorch saves, views included.
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16,
                           torch::kLong, torch::kInt, torch::kShort, torch::kChar, torch::kByte,
                           torch::kBool, torch::kComplexFloat, torch::kComplexDouble}) {
    const auto tensor = torch::arange(24).reshape({2, 3, 4}).to(dtype).transpose(0, 2);
    torch::save(std::vector<torch::Tensor>{tensor, tensor.select(1, 1), torch::empty({0, 3})},
                path.string());
    INFO("dtype " << dtype);
    CHECK_NOTHROW(amp::check_archive(path.string()));
    std::vector<torch::Tensor> back;
    amp::load(back, path.string());
    REQUIRE(back.size() == 3);
    CHECK(torch::equal(back[0], tensor));
    CHECK(torch::equal(back[1], tensor.select(1, 1)));
  }

  // amp's fused optimizer and LibTorch's SGD with momentum (their state in nested archives).
  {
    auto weight = torch::ones({3}, torch::requires_grad());
    weight.mutable_grad() = torch::full({3}, 0.5);
    amp::optim::FusedAdamW adamw({weight}, amp::optim::FusedAdamWOptions(0.01));
    torch::optim::SGD sgd({weight}, torch::optim::SGDOptions(0.1).momentum(0.9));
    adamw.step();
    sgd.step();
    torch::save(adamw, path.string());
    CHECK_NOTHROW(amp::check_archive(path.string()));
    amp::optim::FusedAdamW adamw_back({weight}, amp::optim::FusedAdamWOptions(0.01));
    amp::load(adamw_back, path.string());
    torch::save(sgd, path.string());
    CHECK_NOTHROW(amp::check_archive(path.string()));
  }
  std::filesystem::remove(path);
}

TEST_CASE("Archives that reach LibTorch's crashes and hangs are refused first", "[archive]") {
  const auto path = temp_path("bad.pt");
  const std::string good = amp_test::checkpoint_archive_bytes(cpu_scaler());
  const auto refused = [&](const std::string& bytes) {
    write_file(path, bytes);
    try {
      amp::check_archive(path.string());
    } catch (const c10::Error& error) {
      return std::string(error.msg());
    }
    return std::string("accepted");
  };
  REQUIRE(refused(good) == "accepted");

  // A storage type LibTorch does not know (its reader crashed on an unknown dtype).
  CHECK_THAT(refused(edit_entry(good, "/data.pkl", "FloatStorage", "FlootStorage")),
             Contains("GLOBAL imports 'torch'.'FlootStorage', which amp does not read") &&
                 Contains("' is not a readable LibTorch archive (corrupt, truncated, or not "
                          "written by torch::save / OutputArchive::save_to)"));
  // A tensor record claiming more elements than its data entry holds (12 floats: 48 bytes): the
  // first record ends "cpu", BINPUT n, BININT1 12.
  const auto first_record = good.find("cpu");
  REQUIRE(good.substr(first_record + 3, 1) == "q");
  REQUIRE(good.substr(first_record + 5, 2) == "K\x0c");
  CHECK_THAT(refused(edit_entry(good, "/data.pkl", good.substr(first_record, 7),
                                good.substr(first_record, 6) + "\x7f")),
             Contains("says 127 elements of 4 bytes but 'data/0' has 48 bytes"));
  // A view reaching past its storage: sizes (3, 4) with strides (4, 1) -> (3, 4) with (5, 1).
  CHECK_THAT(refused(edit_entry(good, "/data.pkl", std::string("\x28\x4b\x04\x4b\x01\x74", 6),
                                std::string("\x28\x4b\x05\x4b\x01\x74", 6))),
             Contains("_rebuild_tensor_v2 reads past its storage of 12 elements"));
  // A method in the class definitions, and a type nested 20 deep (LibTorch's parser recursed).
  CHECK_THAT(refused(edit_entry(good, ".py", "  bias : Tensor", "  def forward()")),
             Contains("line 5 is '  def forward()', which is not a line LibTorch writes"));
  // The zip's central directory size set to 0xFFFFFFFF, with the ZIP64 locator that would give
  // it broken.
  {
    std::string bytes = good;
    const auto eocd = bytes.rfind(std::string("PK\x05\x06", 4));
    amp_test::put_le32(bytes, eocd + 12, 0xffffffffu);
    amp_test::put_le32(bytes, eocd - 20, 0);
    CHECK_THAT(refused(bytes),
               Contains("ZIP64 markers") && Contains("no ZIP64 end-of-central-directory locator"));
  }
  // A truncated file, an empty one, a folder and a missing file.
  CHECK_THAT(refused(good.substr(0, good.size() / 2)),
             Contains("is not a readable LibTorch archive"));
  CHECK_THAT(refused(""), Contains("too short for a zip archive"));
  CHECK_THROWS_WITH(amp::check_archive(std::filesystem::temp_directory_path().string()),
                    Contains("is not a regular file (a folder, FIFO or device)"));
  CHECK_THROWS_WITH(amp::load_archive((path.string() + ".missing")),
                    Contains("cannot open '" + path.string() + ".missing': No such file"));
  std::filesystem::remove(path);
}

TEST_CASE("The archive pickle scanner bounds nesting, memo indices, lengths and imports",
          "[archive]") {
  const auto check = [](const std::string& bytes) {
    check_archive_pickle(bytes, "x/data.pkl", kNoRecords);
  };
  CHECK_NOTHROW(
      check(pickle("]q\x00(K\x01K\x02"
                   "e"s)));  // [1, 2] with BINPUT 0 and APPENDS
  // Lists nested 10^6 deep (LibTorch's reader overflowed its stack freeing them): refused at 100.
  CHECK_THROWS_WITH(check(pickle(std::string(1000000, ']') + std::string(999999, 'a'))),
                    Contains("values nest more than 100 deep"));
  CHECK_THROWS_WITH(check(pickle(std::string(500, '(') + ")")),
                    Contains("MARKs nest more than 100"));
  // Deep nesting smuggled through memo references to lists already inside others.
  CHECK_THROWS_WITH(check(pickle("]q\x00]q\x01"
                                 "ah\x01]a"s)),
                    Contains("changes a list that is already inside another value"));
  // Memo index 2^28 (LibTorch's reader sized its memo to it and hung).
  CHECK_THROWS_WITH(check(pickle("Nr\x00\x00\x00\x10"s)),
                    Contains("stores memo index 268435456 but only 0 entries exist"));
  CHECK_THROWS_WITH(check(pickle("h\x05")), Contains("fetches memo index 5, which nothing"));
  // A GLOBAL without its newline, a 4 GB string, an unknown opcode.
  CHECK_THROWS_WITH(check(std::string("\x80\x02"
                                      "c__torch__",
                                      11) +
                          std::string(5000, 'x')),
                    Contains("'x/data.pkl' byte 2: opcode 0x63 (GLOBAL) has no newline within 256 "
                             "bytes to end its argument"));
  CHECK_THROWS_WITH(check(pickle(std::string("X\xff\xff\xff\xff"
                                             "abc",
                                             8))),
                    Contains("'x/data.pkl' byte 2: opcode 0x58 (BINUNICODE) needs 4294967295 "
                             "argument bytes but the pickle ends after 4; the pickle is "
                             "truncated"));
  CHECK_THROWS_WITH(check(pickle("\x8f")),
                    Contains("opcode 0x8f (EMPTY_SET, a set) is not used by LibTorch's archives"));
  CHECK_THROWS_WITH(
      check(pickle("cos\nsystem\n")),
      Contains("GLOBAL imports 'os'.'system', which amp does not read (only __torch__ classes"));
  // BUILD gives attributes to an OrderedDict (Python's state_dict `_metadata`), nothing else.
  CHECK_NOTHROW(check(pickle("ccollections\nOrderedDict\n)R}b"s)));
  CHECK_THROWS_WITH(check(pickle("}}b"s)),
                    Contains("opcode 0x62 (BUILD) applies to a dict, which it cannot change"));
  CHECK_THROWS_WITH(check(pickle("ccollections\nOrderedDict\n)RNb"s)),
                    Contains("BUILD gives an OrderedDict None rather than a dict of attributes"));
  // restore_type_tag with a type nested 20 deep.
  std::string deep = "int";
  for (int k = 0; k < 20; ++k) deep = "List[" + deep + "]";
  const std::string tag = "ctorch.jit._pickle\nrestore_type_tag\n]X" +
                          std::string(1, static_cast<char>(deep.size())) + std::string(3, '\0') +
                          deep + "\x86R";
  CHECK_THROWS_WITH(check(pickle(tag)), Contains("nests brackets more than 16 deep"));
  CHECK_THROWS_WITH(check(pickle("NN")), Contains("STOP with 2 value(s)"));
  CHECK_THROWS_WITH(check(""), Contains("'x/data.pkl' byte 0: the entry is empty"));
}

TEST_CASE("The archive code check accepts LibTorch's class definitions only", "[archive]") {
  CHECK_NOTHROW(check_archive_code(
      "class Module(Module):\n  __parameters__ = [\"weight\", \"bias\", ]\n  __buffers__ = []\n"
      "  __annotations__ = []\n  __annotations__[\"a/\\\"b\"] = Dict[str, Tensor]\n"
      "  betas : Tuple[float, float]\n  empty : Tuple[()]\n  sub : "
      "__torch__.___torch_mangle_2.Module\n",
      "x/code/__torch__.py"));
  CHECK_THROWS_WITH(check_archive_code("class Module(Module):\n  x = 1 + 2\n", "c.py"),
                    Contains("'c.py' byte 22: line 2 is '  x = 1 + 2', which is not a line "
                             "LibTorch writes"));
  CHECK_THROWS_WITH(check_archive_code("import os\n", "c.py"),
                    Contains("'c.py' byte 0: line 1 is 'import os'"));
  CHECK_THROWS_WITH(check_archive_code("  __parameters__ = [\"a\"]\n", "c.py"),
                    Contains("'c.py' byte 0: line 1 is"));
  // A type in a code line is refused at its own byte: line 2 starts at 17, its type at 23.
  CHECK_THROWS_WITH(check_archive_code("class M(Module):\n  x : List[in t]\n", "c.py"),
                    Contains("'c.py' byte 23: the type 'List[in t]' has 'in t' where a type name "
                             "should be"));
  CHECK_NOTHROW(check_archive_type("Optional[List[Dict[str, Tensor]]]", "t"));
  CHECK_THROWS_WITH(check_archive_type("List[int", "t"),
                    Contains("'t' byte 0: the type 'List[int' has an unclosed '['"));
  CHECK_THROWS_WITH(check_archive_type("List[in t]", "t"), Contains("where a type name should be"));
  CHECK_THROWS_WITH(check_archive_type(std::string(10000, 'a'), "t"), Contains("is 10000 bytes"));
}

TEST_CASE("amp::load names the file when LibTorch's reader or the value refuses it", "[archive]") {
  const auto path = temp_path("value.pt");
  // A scaler archive whose scale is 1e39 (not a float32): refused, scaler unchanged.
  auto source = cpu_scaler(amp::GradScalerOptions().init_scale(1024.0));
  torch::save(source, path.string());
  {
    std::string bytes = read_file(path);
    double scale = 1024.0, huge = 1e39;
    std::string from(8, '\0'), to(8, '\0');
    // BINFLOAT is big-endian.
    for (int k = 0; k < 8; ++k) {
      std::uint64_t a, b;
      std::memcpy(&a, &scale, 8);
      std::memcpy(&b, &huge, 8);
      from[k] = static_cast<char>((a >> (8 * (7 - k))) & 0xff);
      to[k] = static_cast<char>((b >> (8 * (7 - k))) & 0xff);
    }
    write_file(path, edit_entry(bytes, "/data.pkl", "G" + from, "G" + to));
  }
  auto target = cpu_scaler(amp::GradScalerOptions().init_scale(8.0));
  CHECK_THROWS_WITH(amp::load(target, path.string()),
                    Contains("cannot load '" + path.string() + "': ") && Contains("1e+39"));
  CHECK(target.get_scale() == 8.0);
  std::filesystem::remove(path);
}
