// Replays fuzz inputs without libFuzzer: feeds every file of the directories given on the command
// line to LLVMFuzzerTestOneInput, so the kept corpus and past crashes run in the normal test suite.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::size_t replayed = 0;
  for (int k = 1; k < argc; ++k) {
    const fs::path directory = argv[k];
    // A target without recorded crashes has no crashes/ directory; a corpus must exist.
    if (!fs::exists(directory)) continue;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(directory)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    for (const fs::path& file : files) {
      std::ifstream in(file, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                    std::istreambuf_iterator<char>());
      std::printf("%s (%zu bytes)\n", file.c_str(), bytes.size());
      std::fflush(stdout);  // so a crash names the input it died on
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  std::printf("replayed %zu inputs\n", replayed);
  return replayed > 0 ? 0 : 1;
}
