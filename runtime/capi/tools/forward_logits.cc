// spc_forward_logits: the logits of one forward of a prompt, as raw bytes, for comparing runtimes
// and machines bit for bit (an aarch64 build under qemu against the Python runtime on x86, ...).
//
//   spc_forward_logits <model_dir> <lib.so> <out.bin> [--device D] [--last] <token ids...>
//
// loads the model as spc_model_load does (src/model.h Model: the same checks, weights and device),
// creates a KV cache for the prompt, appends the tokens to a fresh sequence in ONE forward, and
// writes the logits to out.bin as little-endian float32, row-major, no header:
//
//   default  [n_tokens, vocab]: every position's logits, from the library's forward_tokens entry
//            point -- the twin of the Python runtime's runtime/model.py Model.forward(kv, [seq],
//            [tokens]) (outputs="logits"), which calls the same entry point;
//   --last   [1, vocab]: the last position's only, from the prefill entry point (the one the C API's
//            sessions prefill a prompt with; it computes logits at the last row only) -- the twin of
//            runtime/model.py Model.prefill(kv, [seq], [tokens]).
//
// Token ids are separate arguments or comma-separated (1,2,3). The prompt must fit one forward:
// at most the model's prefill_chunk_size tokens (a longer one is refused, not split). A line of
// JSON on stdout says what was written: {"rows", "vocab", "dtype", "entry", "device",
// "load_seconds", "forward_seconds"}.
#include <tvm/ffi/error.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "../src/kv_cache.h"
#include "../src/model.h"

namespace {

const char kUsage[] =
    "usage: spc_forward_logits <model_dir> <lib.so> <out.bin> [--device D] [--last] <token ids...>\n"
    "  writes the logits of one forward of the tokens (a fresh sequence) to out.bin as little-endian\n"
    "  float32, row-major, no header: [n_tokens, vocab] from forward_tokens (every position; the twin\n"
    "  of runtime/model.py Model.forward), or with --last [1, vocab] from prefill (the last position\n"
    "  only; the twin of Model.prefill). Token ids: separate arguments or comma-separated.\n"
    "  --device: auto (default: the library's own), cpu/llvm, cuda, opencl, vulkan, metal[:id].\n";

bool ParseIds(const std::string& arg, std::vector<int32_t>* out) {
  size_t at = 0;
  while (at <= arg.size()) {
    size_t comma = arg.find(',', at);
    std::string piece = arg.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (piece.empty() || piece.size() > 10 || piece.find_first_not_of("0123456789") != std::string::npos) return false;
    long long v = std::stoll(piece);
    if (v > INT32_MAX) return false;
    out->push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return true;
}

const char* DeviceName(DLDeviceType t) {
  switch (t) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLOpenCL: return "opencl";
    case kDLVulkan: return "vulkan";
    case kDLMetal: return "metal";
    default: return "other";
  }
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Little-endian float32 whatever the host's byte order (the byte order is part of the format).
void WriteLE(std::ofstream& out, const std::vector<char>& host) {
  const uint16_t probe = 1;
  unsigned char first = 0;
  std::memcpy(&first, &probe, 1);
  if (first == 1) {
    out.write(host.data(), static_cast<std::streamsize>(host.size()));
    return;
  }
  std::vector<char> swapped(host.size());
  for (size_t i = 0; i + 4 <= host.size(); i += 4)
    for (size_t b = 0; b < 4; ++b) swapped[i + b] = host[i + 3 - b];
  out.write(swapped.data(), static_cast<std::streamsize>(swapped.size()));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  std::vector<int32_t> tokens;
  std::string device = "auto";
  bool last_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a == "--last") {
      last_only = true;
    } else if (a.compare(0, 2, "--") == 0) {
      std::fprintf(stderr, "unknown option %s\n%s", a.c_str(), kUsage);
      return 2;
    } else if (positional.size() < 3) {
      positional.push_back(a);
    } else if (!ParseIds(a, &tokens)) {
      std::fprintf(stderr, "not a token id (or comma-separated ids): '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (positional.size() < 3 || tokens.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string &model_dir = positional[0], &lib_path = positional[1], &out_path = positional[2];
  try {
    auto t0 = std::chrono::steady_clock::now();
    spc::Model model(model_dir, lib_path, device);
    double load_seconds = Since(t0);
    int64_t n = static_cast<int64_t>(tokens.size());
    int64_t limit = model.config().prefill_chunk_size;
    if (n > limit) {
      std::fprintf(stderr, "%lld tokens do not fit one forward of %s: at most %lld (its prefill_chunk_size)\n",
                   static_cast<long long>(n), lib_path.c_str(), static_cast<long long>(limit));
      return 2;
    }
    spc::Tensor kv_tensor;
    int64_t pages = 0;
    model.CreateKVCache(n, &kv_tensor, &pages);
    spc::PagedKV kv(pages, model.page_size());
    const int64_t kSeq = 0;
    kv.AddSequence(kSeq);
    t0 = std::chrono::steady_clock::now();
    spc::Tensor logits = last_only ? model.Prefill(kv, kv_tensor, kSeq, tokens)
                                   : model.Forward(kv, kv_tensor, kSeq, tokens, nullptr, spc::kLogits).logits;
    std::vector<char> host = spc::Model::ToHost(logits);  // waits for the device
    double forward_seconds = Since(t0);
    const DLTensor* d = logits.GetDLTensorPtr();
    int64_t rows = d->ndim == 2 ? d->shape[0] : 0, vocab = d->ndim == 2 ? d->shape[1] : 0;
    if (d->dtype.code != kDLFloat || d->dtype.bits != 32 || d->dtype.lanes != 1 || vocab != model.vocab_size() ||
        rows != (last_only ? 1 : n)) {
      std::fprintf(stderr, "%s returned logits that are not float32 [%lld, %lld]\n", lib_path.c_str(),
                   static_cast<long long>(last_only ? 1 : n), static_cast<long long>(model.vocab_size()));
      return 1;
    }
    std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
    if (out) WriteLE(out, host);
    if (!out || !out.flush()) {
      std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
      return 1;
    }
    DLDevice dev = model.device();
    std::printf("{\"rows\": %lld, \"vocab\": %lld, \"dtype\": \"float32\", \"entry\": \"%s\", \"device\": \"%s:%d\", "
                "\"load_seconds\": %.3f, \"forward_seconds\": %.3f}\n",
                static_cast<long long>(rows), static_cast<long long>(vocab), last_only ? "prefill" : "forward_tokens",
                DeviceName(dev.device_type), dev.device_id, load_seconds, forward_seconds);
    return 0;
  } catch (const spc::IoError& e) {
    std::fprintf(stderr, "I/O error: %s\n", e.what());
  } catch (const spc::IncompatibleError& e) {
    std::fprintf(stderr, "incompatible: %s\n", e.what());
  } catch (const tvm::ffi::Error& e) {
    std::fprintf(stderr, "TVM error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}
