#include "train/output/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "tensor/kernels.h"
#include "train/files.h"

namespace attograd::train::output {

// Tensor bytes are copied as they lie in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i64: return "I64";
    case DType::bf16: return "BF16";
    case DType::b8: return nullptr;
  }
  return nullptr;
}

bool parse_dtype(const std::string& name, DType* t) {
  for (DType d : {DType::f32, DType::f64, DType::i64, DType::bf16})
    if (name == safetensors_dtype(d)) return *t = d, true;
  return false;
}

struct Entry {
  std::string name;
  DType dtype;  // in memory: float32 for a widened F16
  Shape shape;
  std::uint64_t begin, end;
  bool f16 = false;  // stored as IEEE half, widened on reading
};

// An IEEE half's value as a float, which holds every half exactly.
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else {
    const std::uint32_t bits = exponent == 0x1fu ? 0x7f800000u | (mantissa << 13)  // inf, NaN
                                                 : ((exponent + 112) << 23) | (mantissa << 13);
    std::memcpy(&value, &bits, 4);
  }
  return h & 0x8000u ? -value : value;
}

}  // namespace

namespace {
// A file's parts in order: the length and JSON header, then each tensor's bytes
// from a contiguous CPU copy (the tensor itself where it is one): written one
// after another, a checkpoint is never a second copy of the model in memory.
struct SafetensorsParts {
  std::string head;
  std::vector<Tensor> host;
  std::vector<std::string_view> pieces() const {
    std::vector<std::string_view> out = {head};
    for (const Tensor& c : host)
      out.emplace_back(static_cast<const char*>(c.raw_data()), c.numel() * dtype_size(c.dtype()));
    return out;
  }
};

SafetensorsParts safetensors_parts(const NamedTensors& tensors, const Metadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;  // contiguous CPU copies, in order
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    AG_CHECK(name != "__metadata__" && !header.contains(name), "safetensors", "duplicate or reserved name '{}'", name);
    const char* dtype = safetensors_dtype(t.dtype());
    AG_CHECK(dtype, "safetensors", "'{}' has dtype {}, which is not saved", name, dtype_name(t.dtype()));
    Tensor c = kernels::contiguous(t.device().is_cpu() ? t : kernels::to_device(t, Device::cpu()));
    const std::uint64_t nbytes = c.numel() * dtype_size(c.dtype());
    header[name] = {{"dtype", dtype}, {"shape", c.sizes()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    host.push_back(c);
  }
  std::string json = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned, as the reference writer does.
  json.append((8 - json.size() % 8) % 8, ' ');
  SafetensorsParts parts{std::string(8, '\0'), std::move(host)};
  const std::uint64_t n = json.size();
  std::memcpy(parts.head.data(), &n, 8);
  parts.head += json;
  return parts;
}
}  // namespace

std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata) {
  const SafetensorsParts parts = safetensors_parts(tensors, metadata);  // alive while its pieces are read
  std::string out;
  for (std::string_view piece : parts.pieces()) out += piece;
  return out;
}

void write_safetensors(std::string_view what, const std::string& path, const NamedTensors& tensors,
                       const Metadata& metadata) {
  const SafetensorsParts parts = safetensors_parts(tensors, metadata);
  write_file_atomically(what, path, parts.pieces());
}

Safetensors parse_safetensors(std::string_view bytes, std::string_view what, SafetensorsRead read,
                              const std::function<void(std::size_t begin, std::size_t end)>& copied) {
  AG_CHECK(bytes.size() >= 8, what, "truncated: {} bytes, too short for the 8-byte header length", bytes.size());
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  AG_CHECK(n <= kMaxSafetensorsHeader, what, "header length {} exceeds the limit of {} bytes (not a safetensors file?)",
           n, kMaxSafetensorsHeader);
  AG_CHECK(n <= bytes.size() - 8, what, "truncated: the header claims {} bytes but only {} follow", n,
           bytes.size() - 8);
  const std::string_view data = bytes.substr(8 + n);

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const nlohmann::json::exception& e) {
    fail(what, "header is not valid JSON: {}", e.what());
  }
  AG_CHECK(header.is_object(), what, "header must be a JSON object");

  Safetensors out;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      AG_CHECK(info.is_object(), what, "__metadata__ must be an object of strings");
      for (const auto& [key, value] : info.items()) {
        AG_CHECK(value.is_string(), what, "__metadata__ '{}' is not a string", key);
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    AG_CHECK(info.is_object() && info.contains("dtype") && info.contains("shape") && info.contains("data_offsets"),
             what, "'{}' needs dtype, shape and data_offsets", name);
    Entry e{name, DType::f32, {}, 0, 0};
    e.f16 = read.widen_f16 && info["dtype"] == "F16";
    AG_CHECK(e.f16 || (info["dtype"].is_string() && parse_dtype(info["dtype"].get<std::string>(), &e.dtype)), what,
             "'{}' has unknown dtype {} (F32, F64, I64, BF16{})", name, info["dtype"].dump(),
             read.widen_f16 ? ", F16" : "");
    const std::uint64_t element = e.f16 ? 2 : dtype_size(e.dtype);
    const auto& shape = info["shape"];
    AG_CHECK(shape.is_array(), what, "'{}' shape must be an array", name);
    // A saturating product: absurd shapes cannot overflow, and they then fail the size check below.
    constexpr std::uint64_t kSaturated = std::uint64_t{1} << 56;
    std::uint64_t numel = 1;
    for (const auto& d : shape) {
      AG_CHECK(d.is_number_unsigned() && d.get<std::uint64_t>() < kSaturated, what,
               "'{}' shape {} must hold non-negative integers below 2^56", name, shape.dump());
      const std::uint64_t size = d.get<std::uint64_t>();
      numel = static_cast<std::uint64_t>(
          std::min<unsigned __int128>(static_cast<unsigned __int128>(numel) * size, kSaturated));
      e.shape.push_back(static_cast<std::int64_t>(size));
    }
    const auto& offsets = info["data_offsets"];
    AG_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                 offsets[1].is_number_unsigned(),
             what, "'{}' data_offsets {} must be [begin, end]", name, offsets.dump());
    e.begin = offsets[0].get<std::uint64_t>(), e.end = offsets[1].get<std::uint64_t>();
    AG_CHECK(e.begin <= e.end && e.end <= data.size(), what,
             "'{}' data_offsets [{}, {}] are out of range: the data section holds {} bytes", name, e.begin, e.end,
             data.size());
    AG_CHECK(numel < kSaturated && e.end - e.begin == numel * element, what,
             "'{}' data_offsets [{}, {}] hold {} bytes, but {} of shape {} needs {}", name, e.begin, e.end,
             e.end - e.begin, info["dtype"].get<std::string>(), shape.dump(), numel * element);
    entries.push_back(std::move(e));
  }

  // Like the reference reader: tensors tile the data section exactly, in
  // offset order, with no overlap and no gap.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t expected = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    AG_CHECK(e.begin >= expected, what, "'{}' data [{}, {}) overlaps '{}' which ends at {}", e.name, e.begin, e.end,
             entries[i - 1].name, expected);
    AG_CHECK(e.begin == expected, what, "gap in the data section: '{}' starts at {}, expected {}", e.name, e.begin,
             expected);
    expected = e.end;
  }
  AG_CHECK(expected == data.size(), what, "the data section holds {} bytes but the tensors cover {}", data.size(),
           expected);

  for (const Entry& e : entries) {
    if (read.wanted && !read.wanted(e.name)) continue;
    Tensor t = empty(e.shape, {e.dtype});
    if (e.f16) {
      float* out = t.data<float>();
      for (std::uint64_t i = 0; i < (e.end - e.begin) / 2; ++i) {
        std::uint16_t h;
        std::memcpy(&h, data.data() + e.begin + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
    } else if (e.end > e.begin) {
      std::memcpy(t.raw_data(), data.data() + e.begin, e.end - e.begin);
    }
    if (copied) copied(8 + n + e.begin, 8 + n + e.end);
    out.tensors.emplace(e.name, t);
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  write_safetensors("checkpoint", path, tensors, metadata);
}

Safetensors load_safetensors(const std::string& path, const char* flag, SafetensorsRead read) {
  // Checkpoints are files we wrote: a device or a pipe (/dev/zero) is refused by the mapping.
  const MappedFile file(path, flag);
  AG_CHECK(!file.bytes().empty(), flag, "'{}' is empty (or not a regular file)", path);
  return parse_safetensors(file.bytes(), path, read,
                           [&file](std::size_t begin, std::size_t end) { file.release(begin, end); });
}

}  // namespace attograd::train::output
