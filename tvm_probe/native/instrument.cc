// tvm_probe's native capture instrument: the Relax VM's instrument hook in C++.
//
// The VM calls the instrument before and after every Call instruction as
//     instrument(func, symbol, before_run, ret_value, *args) -> int (0: run the call)
// A Python instrument pays a Python call each time (~3 us); this one does the same work as
// tvm_probe/capture.py's `_Calls.hook` in a few tens of nanoseconds: it counts occurrences per
// symbol, times each kernel call and copies the outputs a plan asks for into one preallocated
// byte arena (memory planning reuses buffers, so an output is copied right after its call).
// Python runs only before a run (`begin`) and after it (`report`); the one exception is the
// optional `on_event` callback, for streaming (outputs handed over as produced) and for the
// rare kernel arguments that must be copied before the call ("untracked" inputs).
//
// Everything is reached through global functions, so a VM can also be instrumented by name
// (`vm.set_instrument("tvm_probe.capture.instrument", session)`), in this process or in an RPC
// server that loaded this library: sessions are held in a table and named by an integer.
//
//   tvm_probe.capture.open(plan: str) -> int             parse a plan (format: see ParsePlan)
//   tvm_probe.capture.instrument(session) -> Function     the hook; a factory set_instrument takes
//   tvm_probe.capture.buffers(session) -> [times, stats]  written by every run (see Session)
//   tvm_probe.capture.begin(session, arena_address, on_event | None)   reset before a run
//   tvm_probe.capture.end(session)                        drop the run's on_event callback
//   tvm_probe.capture.unexpected(session) -> [str]        first calls that matched no site
//   tvm_probe.capture.error(session) -> str               why the instrument stopped a run
//   tvm_probe.capture.arena(session) -> Tensor | None     outputs, when begin got no address
//   tvm_probe.capture.close(session)                      forget the session
//   tvm_probe.capture.noop() -> Function                  an instrument doing nothing (benchmarks)
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace tvm_probe {
namespace ffi = tvm::ffi;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------------- plan
/*! \brief What to do with a call site's outputs. */
enum class Action : int { kNone = 0, kCopy = 1, kEmit = 2 };

/*! \brief One output of a site: where it goes in the arena, and the type it must have. */
struct Slot {
  int64_t offset = -1;
  int64_t nbytes = 0;
  DLDataType dtype{};
  std::vector<int64_t> shape;
};

/*! \brief One kernel call of the compiled `main` (a CallSite of tvm_probe.kernel_map). */
struct Site {
  int symbol = 0;
  bool is_view = false;
  int num_inputs = 0;
  Action action = Action::kNone;
  std::vector<int> untracked;  // argument positions copied before the call
  std::vector<Slot> outputs;
};

struct Plan {
  std::vector<std::string> symbols;             // distinct site symbols
  std::vector<std::vector<int>> sites_of;       // per symbol: site index by occurrence
  std::vector<Site> sites;
  int64_t arena_bytes = 0;
  double signal_check_ms = 20.0;                // how often Ctrl-C is looked for
};

/*!
 * \brief Parse the whitespace-separated plan written by tvm_probe/native/__init__.py:
 *
 *   tvm_probe.plan.1 <arena_bytes> <signal_check_ms> <num_symbols> <symbol>...
 *   <num_sites> then per site:
 *     <symbol id> <is_view> <num_inputs> <action> <num_untracked> <position>...
 *     <num_outputs> then per output: <offset> <nbytes> <code> <bits> <lanes> <ndim> <dim>...
 */
Plan ParsePlan(const std::string& text) {
  std::istringstream in(text);
  std::string magic;
  Plan plan;
  size_t num_symbols = 0, num_sites = 0;
  in >> magic >> plan.arena_bytes >> plan.signal_check_ms >> num_symbols;
  TVM_FFI_CHECK(magic == "tvm_probe.plan.1", ValueError) << "not a tvm_probe plan: " << magic;
  plan.symbols.resize(num_symbols);
  for (auto& s : plan.symbols) in >> s;
  plan.sites_of.resize(num_symbols);
  in >> num_sites;
  plan.sites.resize(num_sites);
  for (size_t i = 0; i < num_sites; ++i) {
    Site& site = plan.sites[i];
    int is_view = 0, action = 0;
    size_t num_untracked = 0, num_outputs = 0;
    in >> site.symbol >> is_view >> site.num_inputs >> action >> num_untracked;
    site.is_view = is_view != 0;
    site.action = static_cast<Action>(action);
    site.untracked.resize(num_untracked);
    for (auto& j : site.untracked) in >> j;
    in >> num_outputs;
    site.outputs.resize(num_outputs);
    for (Slot& slot : site.outputs) {
      int code = 0, bits = 0, lanes = 0, ndim = 0;
      in >> slot.offset >> slot.nbytes >> code >> bits >> lanes >> ndim;
      slot.dtype = DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits),
                              static_cast<uint16_t>(lanes)};
      slot.shape.resize(ndim);
      for (auto& d : slot.shape) in >> d;
    }
    TVM_FFI_CHECK(in && site.symbol >= 0 && static_cast<size_t>(site.symbol) < num_symbols,
                  ValueError) << "malformed tvm_probe plan at site " << i;
    plan.sites_of[site.symbol].push_back(static_cast<int>(i));
  }
  TVM_FFI_CHECK(static_cast<bool>(in), ValueError) << "truncated tvm_probe plan";
  return plan;
}

// ------------------------------------------------------------------------------------- memory
/*! \brief 64-byte aligned host memory for the arena (and the times table). */
struct HostAlloc {
  void AllocData(DLTensor* tensor) {
    size_t nbytes = ffi::GetDataSize(*tensor);
    void* data = nullptr;
    TVM_FFI_CHECK(posix_memalign(&data, 64, nbytes == 0 ? 64 : nbytes) == 0, RuntimeError)
        << "tvm_probe: cannot allocate " << nbytes << " bytes for captured tensors";
    tensor->data = data;
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

ffi::Tensor HostTensor(int64_t n, DLDataType dtype) {
  int64_t shape[1] = {n};
  return ffi::Tensor::FromNDAlloc(HostAlloc(), ffi::ShapeView(shape, 1), dtype,
                                  DLDevice{kDLCPU, 0});
}

const DLTensor* AsTensor(const TVMFFIAny& value) {
  if (value.type_index == ffi::TypeIndex::kTVMFFITensor) {
    return TVMFFITensorGetDLTensorPtr(value.v_obj);
  }
  if (value.type_index == ffi::TypeIndex::kTVMFFIDLTensorPtr) {
    return static_cast<const DLTensor*>(value.v_ptr);
  }
  return nullptr;
}

// ------------------------------------------------------------------------------------- session
/*!
 * \brief One plan and the state of its latest run.
 *
 * What a run did is written into two buffers Python maps once (no call after the run):
 *   times  float64 [2, sites]: start and duration of each call in us, NaN if it was not called
 *   stats  int64 [4]: calls matching no site, bytes copied, 1 if stopped, call sites called
 */
class Session {
 public:
  enum Stat { kUnexpected = 0, kCopiedBytes = 1, kStopped = 2, kCalled = 3, kNumStats = 4 };

  explicit Session(Plan plan) : plan_(std::move(plan)) {
    for (size_t i = 0; i < plan_.symbols.size(); ++i) by_name_[plan_.symbols[i]] = int(i);
    int64_t n = static_cast<int64_t>(plan_.sites.size());
    times_ = HostTensor(2 * n, DLDataType{kDLFloat, 64, 1});
    stats_ = HostTensor(kNumStats, DLDataType{kDLInt, 64, 1});
    times_data_ = static_cast<double*>(times_.data_ptr());
    stats_data_ = static_cast<int64_t*>(stats_.data_ptr());
    seen_.assign(plan_.symbols.size(), 0);
    std::fill(times_data_, times_data_ + 2 * n, NAN);
    std::fill(stats_data_, stats_data_ + kNumStats, 0);
  }

  ffi::Array<ffi::Tensor> Buffers() const { return {times_, stats_}; }

  /*!
   * \brief Reset before a run.  Outputs are copied to `arena_address` (the caller's memory,
   * plan.arena_bytes long) or, when it is 0, to an arena of the session's own (see Arena()).
   * `on_event` (may be None) receives untracked inputs and emitted outputs.
   */
  void Begin(int64_t arena_address, ffi::Optional<ffi::Function> on_event) {
    on_event_ = std::move(on_event);
    std::fill(seen_.begin(), seen_.end(), 0);
    std::fill(times_data_, times_data_ + 2 * plan_.sites.size(), NAN);
    std::fill(stats_data_, stats_data_ + kNumStats, 0);
    symbol_of_ptr_.clear();  // pointers are only known stable within one run of one VM
    unexpected_.clear();
    error_.clear();
    arena_ = ffi::Tensor();
    if (arena_address != 0) {
      arena_data_ = reinterpret_cast<char*>(arena_address);
    } else {
      arena_ = PickArena();
      arena_data_ = arena_.defined() ? static_cast<char*>(arena_.data_ptr()) : nullptr;
    }
    t0_ = last_signal_check_ = Clock::now();
  }

  /*! \brief Drop the run's callback (it holds Python objects). */
  void End() { on_event_ = ffi::Optional<ffi::Function>(); }

  /*! \brief The first calls of the latest run that matched no call site. */
  ffi::Array<ffi::String> UnexpectedCalls() const {
    ffi::Array<ffi::String> out;
    for (const auto& u : unexpected_) out.push_back(ffi::String(u));
    return out;
  }

  /*! \brief Why the instrument stopped the latest run ("" if it did not). */
  ffi::String Error() const { return ffi::String(error_); }

  /*! \brief The session's own arena of the latest run (None when the caller gave one). */
  ffi::Optional<ffi::Tensor> Arena() const {
    return arena_.defined() ? ffi::Optional<ffi::Tensor>(arena_) : ffi::Optional<ffi::Tensor>();
  }

  /*! \brief The instrument itself (see the file comment for the calling convention). */
  void Call(const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) {
    *rv = 0;  // continue with the call
    const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(args);
    int symbol = SymbolOf(raw[1]);
    if (symbol < 0) {
      if (symbol == kUnknown && BeforeRun(raw[2])) Unexpected(SymbolName(raw[1]), -1);
      return;
    }
    const std::vector<int>& sites = plan_.sites_of[symbol];
    if (BeforeRun(raw[2])) {
      int occurrence = seen_[symbol]++;
      if (occurrence >= static_cast<int>(sites.size())) {
        if (!plan_.sites[sites[0]].is_view) Unexpected(SymbolName(raw[1]), occurrence);
        return;
      }
      const Site& site = plan_.sites[sites[occurrence]];
      if (!site.untracked.empty()) EmitUntracked(sites[occurrence], site, raw + 4, num_args - 4);
      if (site.action == Action::kCopy) PrefetchSlots(site);
      t_call_ = Clock::now();
      return;
    }
    Clock::time_point t_end = Clock::now();
    int occurrence = seen_[symbol] - 1;
    if (occurrence >= static_cast<int>(sites.size())) return;
    int index = sites[occurrence];
    const Site& site = plan_.sites[index];
    times_data_[index] = Micros(t_call_ - t0_);
    times_data_[plan_.sites.size() + index] = Micros(t_end - t_call_);
    ++stats_data_[kCalled];
    if (site.action == Action::kCopy) {
      CopyOutputs(index, site, raw + 3, raw + 4, num_args - 4);
    } else if (site.action == Action::kEmit) {
      EmitOutputs(index, site, args + 3, args + 4, num_args - 4);
    }
    if (t_end - last_signal_check_ > signal_period()) CheckSignals(t_end);
  }

 private:
  static constexpr int kBuiltin = -1;  // vm.builtin.* that is no call site: nothing to do
  static constexpr int kUnknown = -2;  // a kernel tvm_probe does not know: behaviour changed

  static bool BeforeRun(const TVMFFIAny& v) { return v.v_int64 != 0; }
  static double Micros(Clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
  }
  Clock::duration signal_period() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(plan_.signal_check_ms));
  }

  static std::string SymbolName(const TVMFFIAny& v) {
    if (v.type_index == ffi::TypeIndex::kTVMFFIRawStr) return v.v_c_str;
    return reinterpret_cast<const ffi::AnyView&>(v).cast<ffi::String>();
  }

  /*! \brief Site symbol id, kBuiltin or kUnknown; keyed by the name's address after the first
   * lookup (the VM passes the same std::string of its function table every time). */
  int SymbolOf(const TVMFFIAny& v) {
    if (v.type_index != ffi::TypeIndex::kTVMFFIRawStr) return Classify(SymbolName(v));
    for (const auto& [ptr, id] : symbol_of_ptr_) {
      if (ptr == v.v_c_str) return id;
    }
    int id = Classify(v.v_c_str);
    symbol_of_ptr_.emplace_back(v.v_c_str, id);
    return id;
  }

  int Classify(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    return name.rfind("vm.builtin.", 0) == 0 ? kBuiltin : kUnknown;
  }

  void Unexpected(const std::string& name, int occurrence) {
    if (unexpected_.size() < 5) {
      unexpected_.push_back(occurrence < 0 ? name : name + "#" + std::to_string(occurrence));
    }
    ++stats_data_[kUnexpected];
  }

  /*! \brief Stop the run with `message` (reported as TVMBehaviourChanged by Python). */
  [[noreturn]] void Fail(const std::string& message) {
    error_ = message;
    stats_data_[kStopped] = 1;
    throw ffi::Error("RuntimeError", "tvm_probe: " + message, "");
  }

  /*!
   * \brief Ask for the arena lines this site's outputs will be copied to, before its kernel
   * runs: a copy into lines already in cache does not wait for them (the arena is cold: it
   * was last written a run or two ago).  Small outputs only; large ones would not fit anyway.
   */
  void PrefetchSlots(const Site& site) const {
    constexpr int64_t kMaxPrefetch = 64 * 1024;
    for (const Slot& slot : site.outputs) {
      const char* dst = arena_data_ + slot.offset;
      for (int64_t b = 0; b < std::min(slot.nbytes, kMaxPrefetch); b += 64) {
        __builtin_prefetch(dst + b, 1, 3);
      }
    }
  }

  void CopyOutputs(int index, const Site& site, const TVMFFIAny* ret, const TVMFFIAny* args,
                   int num_args) {
    for (size_t k = 0; k < site.outputs.size(); ++k) {
      const TVMFFIAny* value = site.is_view ? ret : PositionalOutput(index, site, k, args, num_args);
      const DLTensor* tensor = AsTensor(*value);
      if (tensor == nullptr) Fail(Describe(index, k) + " is not a tensor");
      CopyOne(index, k, *tensor, site.outputs[k]);
    }
  }

  const TVMFFIAny* PositionalOutput(int index, const Site& site, size_t k, const TVMFFIAny* args,
                                    int num_args) {
    int position = site.num_inputs + static_cast<int>(k);
    if (position >= num_args) Fail(Describe(index, k) + " is missing from the call's arguments");
    return args + position;
  }

  void CopyOne(int index, size_t k, const DLTensor& tensor, const Slot& slot) {
    bool same_type = tensor.dtype.code == slot.dtype.code && tensor.dtype.bits == slot.dtype.bits &&
                     tensor.dtype.lanes == slot.dtype.lanes &&
                     tensor.ndim == static_cast<int>(slot.shape.size()) &&
                     std::equal(slot.shape.begin(), slot.shape.end(), tensor.shape);
    if (!same_type) Fail(Describe(index, k) + " does not have the shape and dtype compiled for it");
    if (!ffi::IsContiguous(tensor)) Fail(Describe(index, k) + " is not contiguous");
    char* dst = arena_data_ + slot.offset;
    const char* src = static_cast<const char*>(tensor.data) + tensor.byte_offset;
    if (tensor.device.device_type == kDLCPU) {
      std::memcpy(dst, src, slot.nbytes);
    } else {
      CopyFromDevice(tensor, dst, slot.nbytes);
    }
    stats_data_[kCopiedBytes] += slot.nbytes;
  }

  /*! \brief Device → host through the TVM runtime (the same function Tensor.numpy() uses). */
  void CopyFromDevice(const DLTensor& tensor, char* dst, int64_t nbytes) {
    if (!copy_to_bytes_.has_value()) {
      copy_to_bytes_ = ffi::Function::GetGlobalRequired("runtime.TVMTensorCopyToBytes");
    }
    (*copy_to_bytes_)(const_cast<DLTensor*>(&tensor), static_cast<void*>(dst),
                      static_cast<int64_t>(nbytes));
  }

  void EmitOutputs(int index, const Site& site, const ffi::AnyView* ret,
                   const ffi::AnyView* args, int num_args) {
    size_t n = site.outputs.size();
    if (!site.is_view && site.num_inputs + static_cast<int>(n) > num_args) {
      Fail(Describe(index, n - 1) + " is missing from the call's arguments");
    }
    std::vector<ffi::AnyView> call(2 + n);
    call[0] = 1;
    call[1] = index;
    for (size_t k = 0; k < n; ++k) call[2 + k] = site.is_view ? ret[0] : args[site.num_inputs + k];
    CallBack(call);
  }

  void EmitUntracked(int index, const Site& site, const TVMFFIAny* args, int num_args) {
    std::vector<ffi::AnyView> call(2 + site.untracked.size());
    call[0] = 0;
    call[1] = index;
    for (size_t i = 0; i < site.untracked.size(); ++i) {
      int j = site.untracked[i];
      if (j >= num_args) Fail("argument " + std::to_string(j) + " of call site " +
                              std::to_string(index) + " is missing");
      call[2 + i] = reinterpret_cast<const ffi::AnyView*>(args)[j];
    }
    CallBack(call);
  }

  void CallBack(const std::vector<ffi::AnyView>& call) {
    TVM_FFI_ICHECK(on_event_.has_value()) << "tvm_probe: the plan needs an on_event callback";
    ffi::Any ignored;
    on_event_.value().CallPacked(call.data(), static_cast<int32_t>(call.size()), &ignored);
  }

  /*! \brief Let Python run its SIGINT handler now and then (Ctrl-C stops a long run). */
  void CheckSignals(Clock::time_point now) {
    last_signal_check_ = now;
    if (TVMFFIEnvCheckSignals() != 0) throw ffi::EnvErrorAlreadySet();
  }

  std::string Describe(int index, size_t k) const {
    return "output " + std::to_string(k) + " of call site " + std::to_string(index) + " (" +
           plan_.symbols[plan_.sites[index].symbol] + ")";
  }

  /*! \brief An arena nobody outside holds (numpy views of a former run keep theirs busy). */
  ffi::Tensor PickArena() {
    if (plan_.arena_bytes == 0) return ffi::Tensor();
    for (const ffi::Tensor& t : pool_) {
      if (t.use_count() == 1) return t;
    }
    ffi::Tensor fresh = HostTensor(plan_.arena_bytes, DLDataType{kDLUInt, 8, 1});
    if (pool_.size() < kPoolSize) pool_.push_back(fresh);
    return fresh;
  }

  static constexpr size_t kPoolSize = 2;  // the run being accepted and the run before it

  Plan plan_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<std::pair<const char*, int>> symbol_of_ptr_;
  std::vector<int> seen_;
  ffi::Tensor times_, stats_;
  double* times_data_ = nullptr;
  int64_t* stats_data_ = nullptr;
  std::vector<std::string> unexpected_;
  std::string error_;
  Clock::time_point t0_, t_call_, last_signal_check_;
  ffi::Optional<ffi::Function> on_event_;
  std::optional<ffi::Function> copy_to_bytes_;
  std::vector<ffi::Tensor> pool_;
  ffi::Tensor arena_;
  char* arena_data_ = nullptr;
};

// ------------------------------------------------------------------------------------- registry
/*! \brief Sessions by integer id, so that a VM can be instrumented by name (also over RPC). */
class Registry {
 public:
  static Registry* Global() {
    static Registry* inst = new Registry();
    return inst;
  }
  int64_t Open(const std::string& plan) {
    auto session = std::make_shared<Session>(ParsePlan(plan));
    std::lock_guard<std::mutex> lock(mutex_);
    sessions_[++last_id_] = session;
    return last_id_;
  }
  std::shared_ptr<Session> Get(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sessions_.find(id);
    TVM_FFI_CHECK(it != sessions_.end(), ValueError) << "no tvm_probe capture session " << id;
    return it->second;
  }
  void Close(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    sessions_.erase(id);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, std::shared_ptr<Session>> sessions_;
  int64_t last_id_ = 0;
};

ffi::Function MakeInstrument(int64_t id) {
  std::shared_ptr<Session> session = Registry::Global()->Get(id);
  return ffi::Function::FromPacked(
      [session](const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) {
        session->Call(args, num_args, rv);
      });
}

// Registered when the library is loaded; `override` lets a rebuilt library replace an older one
// loaded in the same process instead of aborting the load.
TVM_FFI_STATIC_INIT_BLOCK() {
  using ffi::Function;
  auto session = [](int64_t id) { return Registry::Global()->Get(id); };
  auto def = [](const char* name, Function f) { Function::SetGlobal(name, std::move(f), true); };
  def("tvm_probe.capture.open", Function::FromTyped([](const std::string& plan) {
        return Registry::Global()->Open(plan);
      }));
  def("tvm_probe.capture.instrument", Function::FromTyped(MakeInstrument));
  def("tvm_probe.capture.buffers",
      Function::FromTyped([session](int64_t id) { return session(id)->Buffers(); }));
  def("tvm_probe.capture.begin",
      Function::FromTyped([session](int64_t id, int64_t arena_address,
                                    ffi::Optional<Function> on_event) {
        session(id)->Begin(arena_address, std::move(on_event));
      }));
  def("tvm_probe.capture.end", Function::FromTyped([session](int64_t id) { session(id)->End(); }));
  def("tvm_probe.capture.unexpected",
      Function::FromTyped([session](int64_t id) { return session(id)->UnexpectedCalls(); }));
  def("tvm_probe.capture.error",
      Function::FromTyped([session](int64_t id) { return session(id)->Error(); }));
  def("tvm_probe.capture.arena",
      Function::FromTyped([session](int64_t id) { return session(id)->Arena(); }));
  // An instrument that does nothing: what TVM's instrument dispatch alone costs (benchmarks).
  def("tvm_probe.capture.noop", Function::FromTyped([]() {
        return Function::FromPacked([](const ffi::AnyView*, int32_t, ffi::Any* rv) { *rv = 0; });
      }));
  def("tvm_probe.capture.close",
      Function::FromTyped([](int64_t id) { Registry::Global()->Close(id); }));
}

}  // namespace tvm_probe
