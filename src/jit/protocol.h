#pragma once
// The messages between kiln and its compile worker (src/jit/worker), and the NVRTC call both run:
// the worker through a dlopen'ed NVRTC, the library (CompileOptions::isolate = false) through the
// one it links, so the two give the same bytes. Header-only and free of CUDA headers: the worker is
// built from it without kiln.
//
// A message is a list of strings: "KJIT1 <count>\n", then per string "<size>\n<bytes>".
// Request: nvrtc library path, output ("cubin" | "ptx"), program name, source, option count, the
// options, then header name / text pairs. Response: status ("ok" | "error"), log, binary.
#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jit::protocol {

inline std::string encode(const std::vector<std::string_view>& parts) {
  size_t total = 16;
  for (std::string_view p : parts) total += p.size() + 24;
  std::string out;
  out.reserve(total);
  out += "KJIT1 " + std::to_string(parts.size()) + "\n";
  for (std::string_view p : parts) {
    out += std::to_string(p.size());
    out += '\n';
    out.append(p.data(), p.size());
  }
  return out;
}

// False on a malformed or truncated message (a worker that died mid-write).
inline bool decode(std::string_view in, std::vector<std::string>& parts) {
  auto number = [&](size_t& value) {
    const size_t nl = in.find('\n');
    if (nl == std::string_view::npos || nl == 0 || nl > 19) return false;
    value = 0;
    for (size_t i = 0; i < nl; ++i) {
      if (in[i] < '0' || in[i] > '9') return false;
      value = value * 10 + static_cast<size_t>(in[i] - '0');
    }
    in.remove_prefix(nl + 1);
    return true;
  };
  if (in.substr(0, 6) != "KJIT1 ") return false;
  in.remove_prefix(6);
  size_t count = 0;
  if (!number(count) || count > (1u << 20)) return false;
  parts.clear();
  for (size_t i = 0; i < count; ++i) {
    size_t size = 0;
    if (!number(size) || size > in.size()) return false;
    parts.emplace_back(in.substr(0, size));
    in.remove_prefix(size);
  }
  return in.empty();
}

struct Request {
  std::string nvrtc_path, output, name, source;
  std::vector<std::string> options;
  std::vector<std::pair<std::string_view, std::string_view>> headers;  // name, text
};

inline std::string encode_request(const Request& r) {
  std::vector<std::string_view> parts = {r.nvrtc_path, r.output, r.name, r.source};
  const std::string n = std::to_string(r.options.size());
  parts.push_back(n);
  for (const std::string& o : r.options) parts.push_back(o);
  for (const auto& [name, text] : r.headers) {
    parts.push_back(name);
    parts.push_back(text);
  }
  return encode(parts);
}

// `parts` must outlive the request (its headers view them).
inline bool decode_request(const std::vector<std::string>& parts, Request& r) {
  if (parts.size() < 5) return false;
  r.nvrtc_path = parts[0], r.output = parts[1], r.name = parts[2], r.source = parts[3];
  char* end = nullptr;
  const unsigned long n = std::strtoul(parts[4].c_str(), &end, 10);
  if (*end != '\0' || parts.size() < 5 + n || (parts.size() - 5 - n) % 2 != 0) return false;
  r.options.assign(parts.begin() + 5, parts.begin() + 5 + static_cast<std::ptrdiff_t>(n));
  r.headers.clear();
  for (size_t i = 5 + n; i < parts.size(); i += 2) r.headers.emplace_back(parts[i], parts[i + 1]);
  return true;
}

struct Response {
  bool ok = false;
  std::string log, binary;
};

// The NVRTC entry points the compile needs (NVRTC's own signatures, with its opaque types as void*
// and its result enum as int).
struct NvrtcApi {
  int (*create)(void** prog, const char* src, const char* name, int n, const char* const* headers,
                const char* const* names) = nullptr;
  int (*compile)(void* prog, int n, const char* const* options) = nullptr;
  int (*destroy)(void** prog) = nullptr;
  int (*log_size)(void* prog, size_t* size) = nullptr;
  int (*log)(void* prog, char* log) = nullptr;
  int (*cubin_size)(void* prog, size_t* size) = nullptr;
  int (*cubin)(void* prog, char* cubin) = nullptr;
  int (*ptx_size)(void* prog, size_t* size) = nullptr;
  int (*ptx)(void* prog, char* ptx) = nullptr;
  const char* (*error_string)(int result) = nullptr;
};

inline Response run_nvrtc(const NvrtcApi& api, const Request& r) {
  Response out;
  auto fail = [&](const char* call, int code) {
    out.ok = false;
    out.log = std::string(call) + " failed: " + api.error_string(code) + "\n" + out.log;
    return out;
  };
  std::vector<std::string> names, texts;  // NUL-terminated copies
  for (const auto& [name, text] : r.headers) names.emplace_back(name), texts.emplace_back(text);
  std::vector<const char*> name_ptrs, text_ptrs, option_ptrs;
  for (size_t i = 0; i < names.size(); ++i) name_ptrs.push_back(names[i].c_str()), text_ptrs.push_back(texts[i].c_str());
  for (const std::string& o : r.options) option_ptrs.push_back(o.c_str());
  void* prog = nullptr;
  int rc = api.create(&prog, r.source.c_str(), r.name.c_str(), static_cast<int>(names.size()), text_ptrs.data(),
                      name_ptrs.data());
  if (rc != 0) return fail("nvrtcCreateProgram", rc);
  rc = api.compile(prog, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  size_t n = 0;
  if (api.log_size(prog, &n) == 0 && n > 1) {
    out.log.assign(n, '\0');
    api.log(prog, out.log.data());
    out.log.resize(n - 1);  // NVRTC counts the terminating NUL
  }
  if (rc != 0) {
    api.destroy(&prog);
    return fail("nvrtcCompileProgram", rc);
  }
  const bool ptx = r.output == "ptx";
  rc = (ptx ? api.ptx_size : api.cubin_size)(prog, &n);
  if (rc == 0) {
    out.binary.assign(n, '\0');
    rc = (ptx ? api.ptx : api.cubin)(prog, out.binary.data());
    if (ptx && n > 0) out.binary.resize(n - 1);  // PTX text without its NUL
  }
  api.destroy(&prog);
  if (rc != 0) return fail(ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN", rc);
  out.ok = true;
  return out;
}

}  // namespace kiln::jit::protocol
