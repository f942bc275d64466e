// The house's shape: no source file outside tests/ passes 600 lines, and no
// function 120, so a file keeps one job and a function fits a reader's screen
// or two. A function is read as clang-format lays this code out: a definition
// that starts at column 0 and ends at the next line that is a lone `}`.
// Members defined inside a class body are indented and not measured. And
// the layers of docs/architecture.md hold: a folder includes only its own
// headers and those of the layers below it.
#include <catch2/catch.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "build_paths.h"

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxFileLines = 600;
constexpr std::size_t kMaxFunctionLines = 120;

// The folders whose sources are the project's own code (tests/ apart).
const char* const kSourceFolders[] = {"base", "tensor", "cpu", "cuda", "autograd", "nn", "train", "bench", "examples"};

bool is_source(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh";
}

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// A line at column 0 that can begin a function definition: an identifier
// (a return type, a macro such as AG_ALWAYS_INLINE or __global__), and not a
// declaration that opens a scope of another kind.
bool may_start_function(const std::string& line) {
  if (line.empty() || !(std::isalpha(static_cast<unsigned char>(line[0])) || line[0] == '_')) return false;
  for (const char* other : {"namespace", "class", "struct", "enum", "union", "using", "typedef", "extern", "template"})
    if (starts_with(line, other)) return false;
  return true;
}

struct LongFunction {
  std::size_t first_line, lines;
};

// Functions longer than kMaxFunctionLines, each from the line its definition
// starts on to its closing `}` at column 0 (template heads not counted). A
// head that ends in `;` before any `{` was a declaration; a definition all on
// one line, or a variable's braced initialiser closed by `};`, is not measured.
std::vector<LongFunction> long_functions(const std::vector<std::string>& lines) {
  std::vector<LongFunction> found;
  std::size_t start = 0;  // 1-based line of the definition under way, 0: none
  bool opened = false;    // its body's `{` seen
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (!start || !opened) {
      if (may_start_function(line)) start = i + 1, opened = false;
      if (!start || line.empty() || starts_with(line, "//")) continue;
      if (line.find('{') != std::string::npos) {
        opened = true;
        if (line.back() == '}') start = 0;  // the whole definition on one line
      } else if (line.back() == ';') {
        start = 0;  // a declaration
      }
    } else if (line == "}") {
      const std::size_t length = i + 1 - start + 1;  // from line `start` to line i + 1, both counted
      if (length > kMaxFunctionLines) found.push_back({start, length});
      start = 0;
    } else if (starts_with(line, "};")) {
      start = 0;
    }
  }
  return found;
}

// The layer of a project path (relative to the root, or as an #include names
// it): its first folder, but cuda/bridge/, the CUDA backend's side that sees
// tensors, which is a layer of its own above the rest of cuda/.
std::string layer_of(const std::string& path) {
  if (starts_with(path, "cuda/bridge/")) return "cuda/bridge";
  return path.substr(0, path.find('/'));
}

// What each layer may include besides itself (docs/architecture.md, "The layers").
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"base", {}},
    {"cuda", {"base"}},
    {"tensor", {"base", "cuda", "cpu"}},
    {"cpu", {"base", "tensor"}},
    {"cuda/bridge", {"base", "cuda", "tensor"}},
    {"autograd", {"base", "tensor"}},
    {"nn", {"base", "tensor", "autograd"}},
    {"train", {"base", "cuda", "tensor", "cpu", "autograd", "nn"}},
};

// The project header a line includes (`#include "tensor/tensor.h"`), or "".
std::string project_include(const std::string& line) {
  if (!starts_with(line, "#include \"")) return "";
  const std::size_t end = line.find('"', 10);
  const std::string path = line.substr(10, end == std::string::npos ? 0 : end - 10);
  return path.find('/') == std::string::npos ? "" : path;
}

// Whether a file of layer `from` may include `header`.
bool may_include(const std::string& from, const std::string& header) {
  const std::string to = layer_of(header);
  if (to == from || !kMayInclude.count(to)) return true;  // its own, or not a layer (a system header's folder)
  return kMayInclude.at(from).count(to) > 0;
}

}  // namespace

TEST_CASE("house: a layer includes only itself and the layers below it", "[house]") {
  const fs::path root = attograd::test::kSourceDir;
  std::size_t includes = 0;
  for (const auto& [layer, below] : kMayInclude) {
    if (layer == "cuda/bridge") continue;  // walked with cuda/
    for (const auto& entry : fs::recursive_directory_iterator(root / layer)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      const std::string name = fs::relative(entry.path(), root).generic_string();
      const std::string from = layer_of(name);
      for (const std::string& line : read_lines(entry.path())) {
        const std::string header = project_include(line);
        if (header.empty()) continue;
        ++includes;
        INFO(name << " (" << from << ") includes " << header);
        CHECK(may_include(from, header));
      }
    }
  }
  CHECK(includes > 300);  // the walk found the tree
}

TEST_CASE("house: the layer rule refuses an include from above", "[house]") {
  CHECK(project_include("#include \"tensor/tensor.h\"") == "tensor/tensor.h");
  CHECK(project_include("#include <vector>").empty());
  CHECK(layer_of("cuda/bridge/launch.h") == "cuda/bridge");
  CHECK(layer_of("cuda/launchers.h") == "cuda");
  CHECK(may_include("cuda/bridge", "tensor/tensor.h"));
  CHECK_FALSE(may_include("cuda", "tensor/tensor.h"));
  CHECK_FALSE(may_include("cuda", "cuda/bridge/launch.h"));
  CHECK_FALSE(may_include("tensor", "autograd/ops.h"));
  CHECK_FALSE(may_include("nn", "train/options.h"));
  CHECK(may_include("nn", "nn/layers.h"));
}

TEST_CASE("house: no source file passes 600 lines and no function 120, outside tests/", "[house]") {
  const fs::path root = attograd::test::kSourceDir;
  std::size_t files = 0;
  for (const char* folder : kSourceFolders) {
    REQUIRE(fs::is_directory(root / folder));
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      ++files;
      const std::vector<std::string> lines = read_lines(entry.path());
      const std::string name = fs::relative(entry.path(), root).string();
      INFO(name << ": " << lines.size() << " lines");
      CHECK(lines.size() <= kMaxFileLines);
      for (const LongFunction& f : long_functions(lines)) {
        INFO(name << ":" << f.first_line << ": a function of " << f.lines << " lines: " << lines[f.first_line - 1]);
        CHECK(f.lines <= kMaxFunctionLines);
      }
    }
  }
  CHECK(files > 100);  // the walk found the tree
}

TEST_CASE("house: the function measure finds a long definition and passes short ones", "[house]") {
  const auto body = [](std::vector<std::string>& lines, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) lines.push_back("  ++a;");
  };
  std::vector<std::string> lines = {"namespace x {", "int declared(int a);", "int one_line(int a) { return a; }", ""};
  lines.push_back("int short_one(int a) {");  // line 5
  body(lines, 3);
  lines.push_back("}");
  lines.push_back("AG_ALWAYS_INLINE void long_one(int a,");  // line 10
  lines.push_back("                               int b) {");
  body(lines, kMaxFunctionLines);
  lines.push_back("}");
  lines.push_back("struct S {");
  body(lines, kMaxFunctionLines + 5);
  lines.push_back("};");
  lines.push_back("const auto lambda = [](int a) {");
  body(lines, kMaxFunctionLines + 5);
  lines.push_back("};");
  lines.push_back("void just_long_enough(int a) {");
  body(lines, kMaxFunctionLines - 2);
  lines.push_back("}");
  const std::vector<LongFunction> found = long_functions(lines);
  REQUIRE(found.size() == 1);
  CHECK(found[0].first_line == 10);
  CHECK(found[0].lines == kMaxFunctionLines + 3);
}
