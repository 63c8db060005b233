// The C++ side of the differential fuzzer (difffuzz.py): executes GradScaler API calls read from
// stdin, one per line, and answers each with one line: whether it threw, and the whole state
// reached (scale, tracker, extension state, parameters, gradients, optimizer state, options), as
// raw bits, plus whether that state survives save -> load into a fresh scaler.
//
// Protocol (words separated by spaces; floats as C99/Python hex literals, "inf" or "nan"):
//   new key=value...      a fresh run: scaler options, optimizer and its options, parameters
//   backward mask=M coef=c,c,...   loss = sum over params i in bitmask M of (p_i * c_i).sum(),
//                         then scaler.scale(loss).backward()
//   unscale | clip max_norm=X | step | update | update_float v=X | update_tensor v=X
//   set_growth_factor v=X | set_backoff_factor v=X | set_growth_interval v=N | zero_grad
//   roundtrip (load the scaler's own state_dict) | fresh (a new scaler loads it and replaces it)
//   save path=P (save_state_dict to P.amp.pt) | load path=P (load_state_dict(P.py.pt))
//   load_dict key=value...  load_state_dict of a dict with those keys (ints or floats)
// Answer: "ok<TAB><state>" or "err<TAB><message on one line><TAB><state>".
#include <torch/torch.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <amp/grad_scaler.h>
#include <amp/optim.h>

#include "../parity/parity_driver_support.h"

namespace {

using Words = std::map<std::string, std::string>;

double real(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  TORCH_CHECK(end != nullptr && *end == '\0', "difffuzz runner: not a number: '", text, "'");
  return value;
}

int64_t integer(const std::string& text) { return std::stoll(text); }

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

Words parse_words(std::istringstream& in) {
  Words words;
  std::string word;
  while (in >> word) {
    const auto eq = word.find('=');
    TORCH_CHECK(eq != std::string::npos, "difffuzz runner: expected key=value, got '", word, "'");
    words[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return words;
}

const std::string& need(const Words& words, const char* key) {
  const auto it = words.find(key);
  TORCH_CHECK(it != words.end(), "difffuzz runner: missing ", key);
  return it->second;
}

std::string double_bits(double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  char text[24];
  std::snprintf(text, sizeof text, "%016" PRIx64, bits);
  return text;
}

// A tensor's elements as float32 bits ("f"), or as integers ("i"); "none" when undefined.
std::string tensor_bits(const at::Tensor& tensor) {
  if (!tensor.defined()) return "none";
  const at::Tensor t = tensor.detach().cpu().contiguous().reshape(-1);
  std::string out;
  if (t.scalar_type() == at::kFloat) {
    const auto* bits = static_cast<const uint32_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) {
      char text[12];
      std::snprintf(text, sizeof text, "%s%08x", i ? "," : "", bits[i]);
      out += text;
    }
    return out;
  }
  const at::Tensor longs = t.to(at::kLong);
  for (int64_t i = 0; i < longs.numel(); ++i) {
    out += (i ? "," : "") + std::to_string(longs.data_ptr<int64_t>()[i]);
  }
  return out;
}

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  }
  return text;
}

class Run {
 public:
  explicit Run(const Words& w) {
    options_.enabled(integer(need(w, "enabled")) != 0)
        .init_scale(real(need(w, "init_scale")))
        .growth_factor(real(need(w, "growth_factor")))
        .backoff_factor(real(need(w, "backoff_factor")))
        .growth_interval(integer(need(w, "growth_interval")))
        .hysteresis(integer(need(w, "hysteresis")))
        .consecutive_hysteresis(integer(need(w, "consecutive")) != 0)
        .min_scale(real(need(w, "min_scale")))
        .max_scale(real(need(w, "max_scale")))
        .track_counters(integer(need(w, "counters")) != 0);
    extended_ = options_.hysteresis() != 1 || options_.consecutive_hysteresis() ||
                options_.min_scale() > 0 || options_.max_scale() < INFINITY ||
                options_.track_counters();
    scaler_ = std::make_unique<amp::GradScaler>(c10::DeviceType::CPU, options_);
    const auto values = split(need(w, "values"), ',');
    size_t at = 0;
    for (const auto& size : split(need(w, "sizes"), ',')) {
      std::vector<float> init;
      for (int64_t i = 0; i < integer(size); ++i)
        init.push_back(static_cast<float>(real(values.at(at++))));
      params_.push_back(torch::tensor(init, torch::kFloat).requires_grad_(true));
    }
    make_optimizer(w);
  }

  // Executes one call; throws what the API throws.
  void call(const std::string& op, const Words& w) {
    if (op == "backward") {
      const int64_t mask = integer(need(w, "mask"));
      const auto coef = split(need(w, "coef"), ',');
      at::Tensor loss;
      size_t at = 0;
      for (size_t i = 0; i < params_.size(); ++i) {
        const int64_t n = params_[i].numel();
        if ((mask >> i) & 1) {
          std::vector<float> c;
          for (int64_t k = 0; k < n; ++k) c.push_back(static_cast<float>(real(coef.at(at + k))));
          const at::Tensor term = (params_[i] * torch::tensor(c, torch::kFloat)).sum();
          loss = loss.defined() ? loss + term : term;
        }
        at += n;
      }
      scaler_->scale(loss).backward();
    } else if (op == "unscale") {
      scaler_->unscale_(*optimizer_);
    } else if (op == "clip") {
      std::vector<torch::Tensor> with_grads;
      for (const auto& p : params_) {
        if (p.grad().defined()) with_grads.push_back(p);
      }
      if (!with_grads.empty()) amp_parity::clip_grad_norm(with_grads, real(need(w, "max_norm")));
    } else if (op == "step") {
      scaler_->step(*optimizer_);
    } else if (op == "update") {
      scaler_->update();
    } else if (op == "update_float") {
      scaler_->update(real(need(w, "v")));
    } else if (op == "update_tensor") {
      scaler_->update(torch::full({}, static_cast<float>(real(need(w, "v")))));
    } else if (op == "set_growth_factor") {
      scaler_->set_growth_factor(real(need(w, "v")));
    } else if (op == "set_backoff_factor") {
      scaler_->set_backoff_factor(real(need(w, "v")));
    } else if (op == "set_growth_interval") {
      scaler_->set_growth_interval(integer(need(w, "v")));
    } else if (op == "zero_grad") {
      optimizer_->zero_grad();
    } else if (op == "roundtrip") {
      scaler_->load_state_dict(scaler_->state_dict());
    } else if (op == "fresh") {
      auto fresh = std::make_unique<amp::GradScaler>(c10::DeviceType::CPU, options_);
      fresh->load_state_dict(scaler_->state_dict());
      scaler_ = std::move(fresh);
    } else if (op == "save") {
      scaler_->save_state_dict(need(w, "path") + ".amp.pt");
    } else if (op == "load") {
      scaler_->load_state_dict(need(w, "path") + ".py.pt");
    } else if (op == "load_dict") {
      auto dict = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [key, value] : w) {
        // Floats carry a hex point or exponent ("0x1.8p+3"); ints are decimal.
        const bool is_float = value.find('p') != std::string::npos || value == "inf" ||
                              value == "nan" || value == "-inf";
        dict.insert(key, is_float ? c10::IValue(real(value)) : c10::IValue(integer(value)));
      }
      scaler_->load_state_dict(dict);
    } else {
      TORCH_CHECK(false, "difffuzz runner: unknown call '", op, "'");
    }
  }

  std::string state() const {
    std::ostringstream out;
    out << "scale=" << double_bits(scaler_->get_scale())
        << " tracker=" << scaler_->get_growth_tracker();
    // Python's disabled scaler has no factors or interval to read.
    if (options_.enabled()) {
      out << " gf=" << double_bits(scaler_->get_growth_factor())
          << " bf=" << double_bits(scaler_->get_backoff_factor())
          << " gi=" << scaler_->get_growth_interval();
    }
    if (extended_) {
      out << " hyst=" << scaler_->hysteresis_remaining();
      if (options_.track_counters()) {
        const auto c = scaler_->counters();
        out << " counters=" << c.steps_taken << ',' << c.steps_skipped << ','
            << c.consecutive_skips;
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      out << " p" << i << '=' << tensor_bits(params_[i]) << " g" << i << '='
          << tensor_bits(params_[i].grad());
      out << optimizer_state(i);
    }
    out << " reload=" << reload_check();
    return out.str();
  }

 private:
  void make_optimizer(const Words& w) {
    kind_ = need(w, "opt");
    const double lr = real(need(w, "lr"));
    const double weight_decay = real(need(w, "weight_decay"));
    if (kind_ == "sgd" || kind_ == "fused_sgd") {
      const double momentum = real(need(w, "momentum"));
      const double dampening = real(need(w, "dampening"));
      const bool nesterov = integer(need(w, "nesterov")) != 0;
      // The same settings on LibTorch's options and on amp's.
      const auto with_settings = [&](auto options) {
        return options.momentum(momentum)
            .dampening(dampening)
            .weight_decay(weight_decay)
            .nesterov(nesterov);
      };
      if (kind_ == "sgd") {
        optimizer_ = std::make_unique<torch::optim::SGD>(
            params_, with_settings(torch::optim::SGDOptions(lr)));
      } else {
        optimizer_ = std::make_unique<amp::optim::FusedSGD>(
            params_, with_settings(amp::optim::FusedSGDOptions(lr)));
      }
      return;
    }
    const auto betas = std::make_tuple(real(need(w, "beta1")), real(need(w, "beta2")));
    const double eps = real(need(w, "eps"));
    const bool amsgrad = integer(need(w, "amsgrad")) != 0;
    const auto with_settings = [&](auto options) {
      return options.betas(betas).eps(eps).weight_decay(weight_decay).amsgrad(amsgrad);
    };
    if (kind_ == "adam") {
      optimizer_ = std::make_unique<torch::optim::Adam>(
          params_, with_settings(torch::optim::AdamOptions(lr)));
    } else if (kind_ == "fused_adam") {
      optimizer_ = std::make_unique<amp::optim::FusedAdam>(
          params_, with_settings(amp::optim::FusedAdamOptions(lr)));
    } else {
      TORCH_CHECK(kind_ == "fused_adamw", "difffuzz runner: unknown optimizer '", kind_, "'");
      optimizer_ = std::make_unique<amp::optim::FusedAdamW>(
          params_, with_settings(amp::optim::FusedAdamWOptions(lr)));
    }
  }

  // " s<i>=..." for each state tensor the optimizer holds for parameter i, in a fixed order.
  std::string optimizer_state(size_t i) const {
    const auto& states = optimizer_->state();
    const auto found = states.find(params_[i].unsafeGetTensorImpl());
    const std::string tag = " s" + std::to_string(i) + "=";
    if (found == states.end()) return tag + "none";
    const auto& state = *found->second;
    if (kind_ == "sgd") {
      return tag +
             tensor_bits(static_cast<const torch::optim::SGDParamState&>(state).momentum_buffer());
    }
    if (kind_ == "fused_sgd") {
      return tag + tensor_bits(
                       static_cast<const amp::optim::FusedSGDParamState&>(state).momentum_buffer());
    }
    if (kind_ == "adam") {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(state);
      return tag + std::to_string(s.step()) + "/" + tensor_bits(s.exp_avg()) + "/" +
             tensor_bits(s.exp_avg_sq()) + "/" + tensor_bits(s.max_exp_avg_sq());
    }
    const auto& s = static_cast<const amp::optim::FusedAdamParamState&>(state);
    return tag + tensor_bits(s.step()) + "/" + tensor_bits(s.exp_avg()) + "/" +
           tensor_bits(s.exp_avg_sq()) + "/" + tensor_bits(s.max_exp_avg_sq());
  }

  // The property every reachable state must have: what state_dict() and save_state_dict()
  // write loads into a fresh scaler with the same options, which then saves the same dict.
  std::string reload_check() const {
    if (!options_.enabled()) return "ok";
    try {
      const auto saved = scaler_->state_dict();
      amp::GradScaler fresh(c10::DeviceType::CPU, options_);
      fresh.load_state_dict(saved);
      if (fresh.state_dict() != saved) return "dict-differs";
      const std::string path = (std::filesystem::temp_directory_path() /
                                ("amp_difffuzz_" + std::to_string(::getpid()) + ".pt"))
                                   .string();
      scaler_->save_state_dict(path);
      amp::GradScaler from_file(c10::DeviceType::CPU, options_);
      from_file.load_state_dict(path);
      std::filesystem::remove(path);
      if (from_file.state_dict() != saved) return "file-differs";
      return "ok";
    } catch (const c10::Error& e) {
      // One word in the state line: the message with its spaces as underscores.
      std::string message = "refused:" + one_line(e.msg()).substr(0, 300);
      for (char& c : message) {
        if (c == ' ') c = '_';
      }
      return message;
    }
  }

  amp::GradScalerOptions options_;
  bool extended_ = false;
  std::unique_ptr<amp::GradScaler> scaler_;
  std::vector<torch::Tensor> params_;
  std::string kind_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

// c10::Error's what() carries a C++ backtrace after the message; the message alone is compared.
std::string message_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return one_line(error->msg());
  return one_line(e.what());
}

// Warnings (set_growth_interval's, LibTorch's) are not compared; they would only fill the log.
class IgnoreWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

int main() {
  torch::set_num_threads(1);
  IgnoreWarnings ignore;
  c10::WarningUtils::WarningHandlerGuard quiet(&ignore);
  std::ios::sync_with_stdio(false);
  std::unique_ptr<Run> run;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op;
    in >> op;
    if (op == "quit") break;
    const Words words = parse_words(in);
    std::string status = "ok";
    try {
      if (op == "new") {
        run = std::make_unique<Run>(words);
      } else {
        TORCH_CHECK(run != nullptr, "difffuzz runner: 'new' must come first");
        run->call(op, words);
      }
    } catch (const std::exception& e) {
      status = "err\t" + message_of(e);
    }
    std::cout << status << '\t' << (run ? run->state() : std::string("no-run")) << '\n'
              << std::flush;
  }
  return 0;
}
