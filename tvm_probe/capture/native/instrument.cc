// tvm_probe's native capture instrument: the Relax VM's instrument hook in C++.
//
// The VM calls the instrument before and after every Call instruction as
//     instrument(func, symbol, before_run, ret_value, *args) -> int (0: run the call)
// A Python instrument pays a Python call each time (~3 us); this one does the same work as
// tvm_probe/capture.py's `_Calls.hook` in a few tens of nanoseconds: it counts occurrences per
// symbol, times each kernel call and copies the outputs a plan asks for into one preallocated
// byte arena (memory planning reuses buffers, so an output is copied right after its call).
// Python runs only before a run (`begin`) and after it (`end`, then it reads the times and
// stats buffers it mapped once); the one exception is the optional `on_event` callback, for
// streaming (outputs handed over as produced) and for the rare kernel arguments that must be
// copied before the call ("untracked" inputs).
//
// Everything is reached through global functions, so a VM can also be instrumented by name
// (`vm.set_instrument("tvm_probe.capture.instrument", session)`), in this process or in an RPC
// server that loaded this library: sessions are held in a table and named by an integer.  The
// functions marked (RPC) take and return only what TVM RPC carries (integers, strings, tensors),
// so a client drives a session in a server process with them (tvm_probe/capture/remote/).
//
// On a device other than the CPU, a plan can ask for a device sync around every kernel call, so
// that the times are device times (host clock around a device sync; CUDA launches are async),
// and outputs are copied device -> host through the TVM runtime, one copy per output.
//
//   tvm_probe.capture.open(plan: str) -> int             parse a plan (format: see ParsePlan)
//   tvm_probe.capture.instrument(session) -> Function     the hook; a factory set_instrument takes
//   tvm_probe.capture.buffers(session) -> [times, stats]  written by every run (see Session)
//   tvm_probe.capture.times(session) -> Tensor           (RPC) the times buffer alone
//   tvm_probe.capture.stats(session) -> Tensor           (RPC) the stats buffer alone
//   tvm_probe.capture.begin(session, arena_address, on_event | None)   (RPC with 0, None) reset
//   tvm_probe.capture.end(session)                        (RPC) after a run (see Session::End)
//   tvm_probe.capture.unexpected(session) -> str          (RPC) first calls that matched no site,
//                                                         one per line
//   tvm_probe.capture.error(session) -> str               (RPC) why the instrument stopped a run
//   tvm_probe.capture.arena(session) -> Tensor | None     (RPC) outputs, when begin got no address
//   tvm_probe.capture.kept(session, site, position) -> Tensor | None   (RPC) an untracked input
//                                                         kept because begin got no on_event
//   tvm_probe.capture.close(session)                      (RPC) forget the session
//   tvm_probe.capture.noop() -> Function                  an instrument doing nothing (benchmarks)
//   tvm_probe.capture.hook_switch() -> int               a switch for the hooks of one VM
//   tvm_probe.capture.hook(switch, symbol, kernel) -> Function   `kernel` reporting as `symbol`
//                                                         to the session the switch points at
//   tvm_probe.capture.hooked_call(switch, session, arena_address, on_event, function, *args)
//                                                         begin, switch, call, switch back, end
//   tvm_probe.capture.aliases(result, *tensors) -> int    bit i: result may refer to tensor i
//   tvm_probe.capture.prepare_call(function, params, spec, switch, session, expected_calls)
//                                                         -> [call, status]: a whole call's
//                                                         checks, copies and run in one native call
//   tvm_probe.capture.close_switch(switch)                forget the switch (its hooks keep it)
//   tvm_probe.capture.watch_record(address)               the in-flight record of a watched process
//                                                         (0: none), see "watch" below
//   tvm_probe.capture.watch_session(session, table)       the session's kernel map is site table
//                                                         `table` of the watched process
//
// Hooks instead of an instrument (tvm_probe/capture/kernel_hook.py): a VM made with some kernels
// replaced by hooks calls the session only around those kernels, with no instrument dispatch
// on any VM instruction; the bookkeeping (Session::Before / After) is the instrument's own.
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
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <istream>
#include <map>
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
// The plan is laid out flat (arrays of small structs, no per-site vectors): the instrument reads
// it right after a kernel has run and evicted most of the cache, and every pointer followed
// there is a cache miss (measured: ~200 ns a copied site with nested vectors).

/*! \brief What to do with a call site's outputs. */
// kCopyDynamic: copy into the session's own arena, grown as needed, each output's place and
// shape written into the arena's layout rows (symbolic shapes: sizes change from call to call)
enum class Action : uint8_t { kNone = 0, kCopy = 1, kEmit = 2, kCopyDynamic = 3 };

constexpr int kMaxDims = 8;  // shapes are stored inline; a plan with more dims is refused

/*! \brief One output of a site: where it goes in the arena, and the type it must have. */
struct Slot {
  int64_t offset = -1;
  int64_t nbytes = 0;
  DLDataType dtype{};
  int32_t ndim = 0;
  int64_t shape[kMaxDims] = {};
  int32_t row = -1;  // kCopyDynamic: its row in the arena's layout rows
};

/*! \brief One kernel call of the compiled `main` (a CallSite of tvm_probe.kernel_map). */
struct Site {
  int32_t symbol = 0;
  int32_t num_inputs = 0;
  int32_t first_output = 0, num_outputs = 0;      // its outputs: Plan::slots[first_output...]
  int32_t first_untracked = 0, num_untracked = 0;  // Plan::untracked: argument positions
  Action action = Action::kNone;                   //   copied before the call
  bool is_view = false;
};

/*! \brief Per distinct symbol: its sites by occurrence, Plan::occurrences[first...]. */
struct Symbol {
  int32_t first = 0, count = 0;
  bool is_view = false;
};

struct Plan {
  std::vector<std::string> names;     // distinct site symbols
  std::vector<Symbol> symbols;
  std::vector<int32_t> occurrences;   // site indices grouped by symbol, in call order
  std::vector<Site> sites;
  std::vector<Slot> slots;
  std::vector<int32_t> untracked;
  int64_t arena_bytes = 0;
  double signal_check_ms = 20.0;      // how often Ctrl-C is looked for
  bool sync = false;                  // sync sync_device around each kernel call (device times)
  DLDevice sync_device{kDLCPU, 0};
  bool dynamic = false;               // some site copies into the session's growing arena
  int64_t layout_rows = 0;            // outputs of kCopyDynamic sites (Slot::row numbers them)
};

// A dynamic arena starts with a header, the outputs after it:
// - the layout rows: per output of a kCopyDynamic site, in site order, where its copy went in
//   this run: offset in the arena, nbytes (-1: not copied), ndim, dims (kMaxDims of them);
// - then the run's times buffer as it was at its end (starts, then durations, per site).
// They live in the arena so that whoever holds a run's arena holds its layout and its times:
// nothing is copied out after the run (a few KiB allocated there cost microseconds).
constexpr int kLayoutWidth = 3 + kMaxDims;

int64_t Aligned64(int64_t nbytes) { return (nbytes + 63) / 64 * 64; }

/*! \brief Where a dynamic arena's times start: after its layout rows. */
int64_t TimesOffset(const Plan& plan) {
  return Aligned64(plan.layout_rows * kLayoutWidth * int64_t(sizeof(int64_t)));
}

/*! \brief Bytes of a dynamic arena's header (the first output starts there). */
int64_t HeaderBytes(const Plan& plan) {
  return TimesOffset(plan) + Aligned64(2 * int64_t(plan.sites.size()) * int64_t(sizeof(double)));
}

Slot ParseSlot(std::istream& in) {
  Slot slot;
  int code = 0, bits = 0, lanes = 0;
  in >> slot.offset >> slot.nbytes >> code >> bits >> lanes >> slot.ndim;
  TVM_FFI_CHECK(slot.ndim >= 0 && slot.ndim <= kMaxDims, ValueError)
      << "tvm_probe plans hold tensors of up to " << kMaxDims << " dimensions, not " << slot.ndim;
  slot.dtype = DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits),
                          static_cast<uint16_t>(lanes)};
  for (int d = 0; d < slot.ndim; ++d) in >> slot.shape[d];
  return slot;
}

/*! \brief Group the sites by symbol, each group in call order (a counting sort). */
void IndexOccurrences(Plan* plan) {
  for (const Site& site : plan->sites) ++plan->symbols[site.symbol].count;
  int32_t first = 0;
  for (Symbol& symbol : plan->symbols) {
    symbol.first = first;
    first += symbol.count;
    symbol.count = 0;
  }
  plan->occurrences.resize(plan->sites.size());
  for (size_t i = 0; i < plan->sites.size(); ++i) {
    Symbol& symbol = plan->symbols[plan->sites[i].symbol];
    plan->occurrences[symbol.first + symbol.count++] = static_cast<int32_t>(i);
    symbol.is_view = plan->sites[i].is_view;
  }
}

/*!
 * \brief Parse the whitespace-separated plan written by tvm_probe/capture/native/__init__.py:
 *
 *   tvm_probe.plan.2 <arena_bytes> <signal_check_ms> <sync_device_type> <sync_device_id>
 *   <num_symbols> <symbol>...        (a sync_device_type of 0: no sync)
 *   <num_sites> then per site:
 *     <symbol id> <is_view> <num_inputs> <action> <num_untracked> <position>...
 *     <num_outputs> then per output: <offset> <nbytes> <code> <bits> <lanes> <ndim> <dim>...
 */
Plan ParsePlan(const std::string& text) {
  std::istringstream in(text);
  std::string magic;
  Plan plan;
  size_t num_symbols = 0, num_sites = 0;
  int sync_type = 0, sync_id = 0;
  in >> magic;
  TVM_FFI_CHECK(magic == "tvm_probe.plan.2", ValueError)
      << "not a plan of this tvm_probe version (expected tvm_probe.plan.2, got " << magic << ")";
  in >> plan.arena_bytes >> plan.signal_check_ms >> sync_type >> sync_id >> num_symbols;
  plan.sync = sync_type != 0;
  plan.sync_device = DLDevice{static_cast<DLDeviceType>(plan.sync ? sync_type : kDLCPU), sync_id};
  plan.names.resize(num_symbols);
  for (auto& name : plan.names) in >> name;
  plan.symbols.resize(num_symbols);
  in >> num_sites;
  plan.sites.resize(num_sites);
  for (size_t i = 0; i < num_sites; ++i) {
    Site& site = plan.sites[i];
    int is_view = 0, action = 0;
    in >> site.symbol >> is_view >> site.num_inputs >> action >> site.num_untracked;
    site.is_view = is_view != 0;
    site.action = static_cast<Action>(action);
    site.first_untracked = static_cast<int32_t>(plan.untracked.size());
    for (int32_t j = 0, position = 0; j < site.num_untracked && in >> position; ++j) {
      plan.untracked.push_back(position);
    }
    in >> site.num_outputs;
    site.first_output = static_cast<int32_t>(plan.slots.size());
    for (int32_t k = 0; k < site.num_outputs && in; ++k) plan.slots.push_back(ParseSlot(in));
    TVM_FFI_CHECK(in && site.symbol >= 0 && static_cast<size_t>(site.symbol) < num_symbols,
                  ValueError) << "malformed tvm_probe plan at site " << i;
    if (site.action == Action::kCopyDynamic) {
      plan.dynamic = true;
      for (int32_t k = 0; k < site.num_outputs; ++k) {
        plan.slots[site.first_output + k].row = static_cast<int32_t>(plan.layout_rows++);
      }
    }
  }
  TVM_FFI_CHECK(static_cast<bool>(in), ValueError) << "truncated tvm_probe plan";
  IndexOccurrences(&plan);
  return plan;
}

/*! \brief Symbol ids by the address of the name the VM passes, after a first lookup by name
 * (the VM passes the same std::string of its function table every time): open addressing. */
class SymbolCache {
 public:
  static constexpr int kMissing = -3;
  void Clear() {
    entries_.assign(64, Entry{});
    used_ = 0;
  }
  int Find(const char* key) const {
    for (size_t i = Hash(key);; i = (i + 1) & (entries_.size() - 1)) {
      if (entries_[i].key == key) return entries_[i].id;
      if (entries_[i].key == nullptr) return kMissing;
    }
  }
  void Insert(const char* key, int id) {
    if (2 * (used_ + 1) > entries_.size()) Grow();
    size_t i = Hash(key);
    while (entries_[i].key != nullptr) i = (i + 1) & (entries_.size() - 1);
    entries_[i] = Entry{key, id};
    ++used_;
  }

 private:
  struct Entry {
    const char* key = nullptr;
    int id = 0;
  };
  size_t Hash(const char* key) const {
    return (reinterpret_cast<uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull >> 32 & (entries_.size() - 1);
  }
  void Grow() {
    std::vector<Entry> old = std::move(entries_);
    entries_.assign(old.size() * 2, Entry{});
    used_ = 0;
    for (const Entry& e : old) {
      if (e.key != nullptr) Insert(e.key, e.id);
    }
  }
  std::vector<Entry> entries_ = std::vector<Entry>(64);
  size_t used_ = 0;
};

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

/*! \brief A host tensor of `tensor`'s shape and dtype (where a kept input is copied to). */
ffi::Tensor HostTensorLike(const DLTensor& tensor) {
  return ffi::Tensor::FromNDAlloc(HostAlloc(), ffi::ShapeView(tensor.shape, tensor.ndim),
                                  tensor.dtype, DLDevice{kDLCPU, 0});
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

// ------------------------------------------------------------------------------------- watch
// A watched process (tvm_probe/capture/watch.py) keeps a small record in a file its watcher maps
// too: [table, site, state] of the kernel call in flight.  A session whose kernel map is a site
// table of that process writes it before each kernel call (kKernel), after the call while its
// outputs are copied (kCopying) and once done (kBetween): when a kernel kills the process, the
// watcher reads which one.  Three stores a call; none when no record is set.
enum InFlightState : int64_t { kNotRunning = 0, kKernel = 1, kCopying = 2, kBetween = 3 };
volatile int64_t* g_in_flight = nullptr;  // [table, site, state], or none

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
    for (size_t i = 0; i < plan_.names.size(); ++i) by_name_[plan_.names[i]] = int(i);
    int64_t n = static_cast<int64_t>(plan_.sites.size());
    times_ = HostTensor(2 * n, DLDataType{kDLFloat, 64, 1});
    stats_ = HostTensor(kNumStats, DLDataType{kDLInt, 64, 1});
    times_data_ = static_cast<double*>(times_.data_ptr());
    stats_data_ = static_cast<int64_t*>(stats_.data_ptr());
    seen_.assign(plan_.symbols.size(), 0);
    signal_period_ = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(plan_.signal_check_ms));
    std::fill(times_data_, times_data_ + 2 * n, NAN);
    std::fill(stats_data_, stats_data_ + kNumStats, 0);
  }

  ffi::Array<ffi::Tensor> Buffers() const { return {times_, stats_}; }
  ffi::Tensor Times() const { return times_; }
  ffi::Tensor Stats() const { return stats_; }

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
    symbol_cache_.Clear();  // pointers are only known stable within one run of one VM
    unexpected_.clear();
    error_.clear();
    kept_.clear();
    arena_ = ffi::Tensor();
    TVM_FFI_CHECK(!(plan_.dynamic && arena_address != 0), ValueError)
        << "a plan with symbolic shapes copies into the session's own arena: begin it with 0";
    if (arena_address != 0) {
      arena_data_ = reinterpret_cast<char*>(arena_address);
    } else {
      arena_ = PickArena();
      arena_data_ = arena_.defined() ? static_cast<char*>(arena_.data_ptr()) : nullptr;
    }
    if (plan_.dynamic) ResetLayout();
    t0_ = last_signal_check_ = Clock::now();
    running_ = true;
  }

  /*!
   * \brief After a run: drop its callback (it holds Python objects) and stop acting on calls,
   * so that a run nobody began (the VM keeps its instrument) writes nowhere, least of all into
   * an arena its owner has freed since.
   */
  void End() {
    on_event_ = ffi::Optional<ffi::Function>();
    running_ = false;
    if (plan_.dynamic && arena_data_ != nullptr) {  // (the run's times, kept with its outputs)
      std::memcpy(arena_data_ + TimesOffset(plan_), times_data_, 2 * plan_.sites.size() * sizeof(double));
    }
    arena_data_ = nullptr;
  }

  /*! \brief The first calls of the latest run that matched no call site, one per line. */
  ffi::String UnexpectedCalls() const {
    std::string out;
    for (const auto& u : unexpected_) out += (out.empty() ? "" : "\n") + u;
    return ffi::String(out);
  }

  /*! \brief The untracked input `position` of call site `index` in the latest run, when it
   * was kept (begin got no on_event); None when it was not. */
  ffi::Optional<ffi::Tensor> Kept(int64_t index, int64_t position) const {
    auto it = kept_.find({index, position});
    if (it == kept_.end()) return ffi::Optional<ffi::Tensor>();
    return ffi::Optional<ffi::Tensor>(it->second);
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
    if (!running_) return;
    const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(args);
    int id = SymbolOf(raw[1]);
    if (id < 0) {
      if (id == kUnknown && BeforeRun(raw[2])) Unexpected(SymbolName(raw[1]), -1);
      return;
    }
    if (BeforeRun(raw[2])) {
      Before(id, raw + 4, num_args - 4);
    } else {
      After(id, args + 3, args + 4, num_args - 4);
    }
  }

  /*!
   * \brief One call of a hooked kernel (see HookSwitch): `kernel(*args)` between the same
   * bookkeeping the instrument does before and after a call of symbol `id`, so a VM that
   * wraps only some kernels pays nothing for the others and no instrument dispatch at all.
   */
  void Hooked(int id, const ffi::Function& kernel, const ffi::AnyView* args, int32_t num_args,
              ffi::Any* rv) {
    if (!running_ || id < 0) {
      if (running_ && id == kUnknown) Unexpected("(a hooked kernel this plan does not know)", -1);
      kernel.CallPacked(args, num_args, rv);
      return;
    }
    Before(id, reinterpret_cast<const TVMFFIAny*>(args), num_args);
    kernel.CallPacked(args, num_args, rv);
    ffi::AnyView ret = *rv;  // a view's output is what the builtin returns
    After(id, &ret, args, num_args);
  }

  /*! \brief The id of symbol `name` in this plan (kBuiltin / kUnknown when it is no site). */
  int SymbolId(const std::string& name) const { return Classify(name); }

  /*! \brief This session's kernel map is site table `table` of the watched process. */
  void Watch(int64_t table) { watch_table_ = table; }

 private:
  /*! \brief Before a call of symbol `id` with kernel arguments `args`: count it, hand over
   * untracked inputs, start its clock. */
  void Before(int id, const TVMFFIAny* args, int num_args) {
    const Symbol& symbol = plan_.symbols[id];
    int occurrence = seen_[id]++;
    if (occurrence >= symbol.count) {
      // a view too: views are matched by occurrence, and an extra one means the matching
      // of the ones before it cannot be trusted
      Unexpected(plan_.names[id], occurrence);
      return;
    }
    int index = plan_.occurrences[symbol.first + occurrence];
    const Site& site = plan_.sites[index];
    if (site.num_untracked != 0) EmitUntracked(index, site, args, num_args);
    if (plan_.sync) Sync();  // what was launched before is not this call's time
    InFlight(index, kKernel);
    t_call_ = Clock::now();
  }

  /*! \brief After that call (`ret`: what it returned): its time, its outputs copied or emitted. */
  void After(int id, const ffi::AnyView* ret, const ffi::AnyView* args, int num_args) {
    const Symbol& symbol = plan_.symbols[id];
    if (plan_.sync && seen_[id] <= symbol.count) Sync();  // the kernel itself, not its launch
    Clock::time_point t_end = Clock::now();
    int occurrence = seen_[id] - 1;
    if (occurrence >= symbol.count) return;
    int index = plan_.occurrences[symbol.first + occurrence];
    const Site& site = plan_.sites[index];
    InFlight(index, kCopying);
    times_data_[index] = Micros(t_call_ - t0_);
    times_data_[plan_.sites.size() + index] = Micros(t_end - t_call_);
    ++stats_data_[kCalled];
    if (site.action == Action::kCopy) {
      CopyOutputs(index, site, reinterpret_cast<const TVMFFIAny*>(ret),
                  reinterpret_cast<const TVMFFIAny*>(args), num_args);
    } else if (site.action == Action::kEmit) {
      EmitOutputs(index, site, ret, args, num_args);
    } else if (site.action == Action::kCopyDynamic) {
      CopyDynamic(index, site, reinterpret_cast<const TVMFFIAny*>(ret),
                  reinterpret_cast<const TVMFFIAny*>(args), num_args);
    }
    InFlight(index, kBetween);
    if (t_end - last_signal_check_ > signal_period_) CheckSignals(t_end);
  }

  /*! \brief Call site `index` is in `state`, for the watcher of this process (see "watch"). */
  void InFlight(int index, int64_t state) const {
    volatile int64_t* record = g_in_flight;
    if (record == nullptr || watch_table_ < 0) return;
    record[0] = watch_table_;
    record[1] = index;
    record[2] = state;
  }

  static constexpr int kBuiltin = -1;  // vm.builtin.* that is no call site: nothing to do
  static constexpr int kUnknown = -2;  // a kernel tvm_probe does not know: behaviour changed

  static bool BeforeRun(const TVMFFIAny& v) { return v.v_int64 != 0; }
  static double Micros(Clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
  }

  static std::string SymbolName(const TVMFFIAny& v) {
    if (v.type_index == ffi::TypeIndex::kTVMFFIRawStr) return v.v_c_str;
    return reinterpret_cast<const ffi::AnyView&>(v).cast<ffi::String>();
  }

  /*! \brief Site symbol id, kBuiltin or kUnknown; keyed by the name's address after the first
   * lookup (the VM passes the same std::string of its function table every time). */
  int SymbolOf(const TVMFFIAny& v) {
    if (v.type_index != ffi::TypeIndex::kTVMFFIRawStr) return Classify(SymbolName(v));
    int id = symbol_cache_.Find(v.v_c_str);
    if (id == SymbolCache::kMissing) {
      id = Classify(v.v_c_str);
      symbol_cache_.Insert(v.v_c_str, id);
    }
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

  void CopyOutputs(int index, const Site& site, const TVMFFIAny* ret, const TVMFFIAny* args,
                   int num_args) {
    CheckArguments(index, site, num_args);
    for (int32_t k = 0; k < site.num_outputs; ++k) {
      CopyOne(index, k, OutputOf(index, site, k, ret, args), plan_.slots[site.first_output + k]);
    }
  }

  /*! \brief A site's outputs are among the call's arguments (a view's is its result). */
  void CheckArguments(int index, const Site& site, int num_args) {
    if (!site.is_view && site.num_inputs + site.num_outputs > num_args) {
      Fail(Describe(index, site.num_outputs - 1) + " is missing from the call's arguments");
    }
  }

  /*! \brief Output `k` of a site: the call's argument after its inputs, or a view's result. */
  const DLTensor& OutputOf(int index, const Site& site, int32_t k, const TVMFFIAny* ret,
                           const TVMFFIAny* args) {
    const DLTensor* tensor = AsTensor(site.is_view ? *ret : args[site.num_inputs + k]);
    if (tensor == nullptr) Fail(Describe(index, k) + " is not a tensor");
    return *tensor;
  }

  /*! \brief `nbytes` of a contiguous tensor into `dst`, from the host or the device. */
  void CopyBytes(int index, int k, const DLTensor& tensor, char* dst, int64_t nbytes) {
    if (!ffi::IsContiguous(tensor)) Fail(Describe(index, k) + " is not contiguous");
    const char* src = static_cast<const char*>(tensor.data) + tensor.byte_offset;
    if (tensor.device.device_type == kDLCPU) {
      std::memcpy(dst, src, nbytes);
    } else {
      CopyFromDevice(tensor, dst, nbytes);
    }
    stats_data_[kCopiedBytes] += nbytes;
  }

  void CopyOne(int index, int k, const DLTensor& tensor, const Slot& slot) {
    bool same_type = tensor.dtype.code == slot.dtype.code && tensor.dtype.bits == slot.dtype.bits &&
                     tensor.dtype.lanes == slot.dtype.lanes && tensor.ndim == slot.ndim &&
                     std::equal(slot.shape, slot.shape + slot.ndim, tensor.shape);
    if (!same_type) Fail(Describe(index, k) + " does not have the shape and dtype compiled for it");
    CopyBytes(index, k, tensor, arena_data_ + slot.offset, slot.nbytes);
  }

  /*! \brief A kCopyDynamic site's outputs: each at the arena's cursor (grown when full), its
   * place and shape written into its layout row. */
  void CopyDynamic(int index, const Site& site, const TVMFFIAny* ret, const TVMFFIAny* args,
                   int num_args) {
    CheckArguments(index, site, num_args);
    for (int32_t k = 0; k < site.num_outputs; ++k) {
      const DLTensor* tensor = &OutputOf(index, site, k, ret, args);
      const Slot& slot = plan_.slots[site.first_output + k];
      bool same_type = tensor->dtype.code == slot.dtype.code && tensor->dtype.bits == slot.dtype.bits &&
                       tensor->dtype.lanes == slot.dtype.lanes && tensor->ndim == slot.ndim;
      for (int d = 0; same_type && d < slot.ndim; ++d) {
        same_type = slot.shape[d] < 0 || slot.shape[d] == tensor->shape[d];  // -1: symbolic
      }
      if (!same_type) Fail(Describe(index, k) + " does not have the shape and dtype compiled for it");
      int64_t nbytes = static_cast<int64_t>(ffi::GetDataSize(*tensor));
      int64_t offset = cursor_;
      Reserve(offset + nbytes);
      CopyBytes(index, k, *tensor, arena_data_ + offset, nbytes);
      cursor_ = offset + (nbytes + 63) / 64 * 64;
      int64_t* row = reinterpret_cast<int64_t*>(arena_data_) + kLayoutWidth * slot.row;  // (after Reserve)
      row[0] = offset;
      row[1] = nbytes;
      row[2] = tensor->ndim;
      std::copy(tensor->shape, tensor->shape + tensor->ndim, row + 3);
    }
  }

  /*! \brief The dynamic arena holds at least `end` bytes: a larger one (what was copied so far
   * moved over) replaces it, here and in the pool, and is kept for later runs. */
  void Reserve(int64_t end) {
    int64_t capacity = arena_.defined() ? arena_.shape()[0] : 0;
    if (end <= capacity) return;
    ffi::Tensor grown = HostTensor(std::max<int64_t>(end, 2 * capacity), DLDataType{kDLUInt, 8, 1});
    if (cursor_ > 0) std::memcpy(grown.data_ptr(), arena_data_, cursor_);
    for (ffi::Tensor& t : pool_) {
      if (t.same_as(arena_)) t = grown;
    }
    arena_ = grown;
    arena_data_ = static_cast<char*>(arena_.data_ptr());
    dynamic_capacity_ = grown.shape()[0];
  }

  /*! \brief A dynamic run starts with its layout rows saying "not copied", the outputs after its header. */
  void ResetLayout() {
    cursor_ = 0;
    Reserve(HeaderBytes(plan_));
    int64_t* rows = reinterpret_cast<int64_t*>(arena_data_);
    std::fill(rows, rows + kLayoutWidth * plan_.layout_rows, 0);
    for (int64_t i = 0; i < plan_.layout_rows; ++i) rows[kLayoutWidth * i + 1] = -1;
    cursor_ = HeaderBytes(plan_);
  }

  /*! \brief Wait for the plan's device to finish what was launched (runtime.Device_StreamSync
   * on the default stream, what Device.sync() does). */
  void Sync() {
    if (!stream_sync_.has_value()) {
      stream_sync_ = ffi::Function::GetGlobalRequired("runtime.Device_StreamSync");
    }
    (*stream_sync_)(plan_.sync_device, static_cast<int64_t>(0));
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
    int32_t n = site.num_outputs;
    if (!site.is_view && site.num_inputs + n > num_args) {
      Fail(Describe(index, n - 1) + " is missing from the call's arguments");
    }
    std::vector<ffi::AnyView> call(2 + n);
    call[0] = 1;
    call[1] = index;
    for (int32_t k = 0; k < n; ++k) call[2 + k] = site.is_view ? ret[0] : args[site.num_inputs + k];
    CallBack(call);
  }

  void EmitUntracked(int index, const Site& site, const TVMFFIAny* args, int num_args) {
    if (!on_event_.has_value()) {  // no callback (a client over RPC): keep copies to fetch later
      KeepUntracked(index, site, args, num_args);
      return;
    }
    std::vector<ffi::AnyView> call(2 + site.num_untracked);
    call[0] = 0;
    call[1] = index;
    for (int32_t i = 0; i < site.num_untracked; ++i) {
      int j = plan_.untracked[site.first_untracked + i];
      if (j >= num_args) Fail("argument " + std::to_string(j) + " of call site " +
                              std::to_string(index) + " is missing");
      call[2 + i] = reinterpret_cast<const ffi::AnyView*>(args)[j];
    }
    CallBack(call);
  }

  /*! \brief Copy the untracked inputs of call site `index` to new host tensors (see Kept). */
  void KeepUntracked(int index, const Site& site, const TVMFFIAny* args, int num_args) {
    for (int32_t i = 0; i < site.num_untracked; ++i) {
      int j = plan_.untracked[site.first_untracked + i];
      if (j >= num_args) Fail("argument " + std::to_string(j) + " of call site " +
                              std::to_string(index) + " is missing");
      const DLTensor* tensor = AsTensor(args[j]);
      if (tensor == nullptr) Fail("argument " + std::to_string(j) + " of call site " +
                                  std::to_string(index) + " is not a tensor");
      if (!ffi::IsContiguous(*tensor)) Fail("argument " + std::to_string(j) + " of call site " +
                                            std::to_string(index) + " is not contiguous");
      ffi::Tensor copy = HostTensorLike(*tensor);
      int64_t nbytes = static_cast<int64_t>(ffi::GetDataSize(*tensor));
      const char* src = static_cast<const char*>(tensor->data) + tensor->byte_offset;
      if (tensor->device.device_type == kDLCPU) {
        std::memcpy(copy.data_ptr(), src, nbytes);
      } else {
        CopyFromDevice(*tensor, static_cast<char*>(copy.data_ptr()), nbytes);
      }
      kept_[{index, j}] = copy;
    }
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

  std::string Describe(int index, int k) const {
    return "output " + std::to_string(k) + " of call site " + std::to_string(index) + " (" +
           plan_.names[plan_.sites[index].symbol] + ")";
  }

  /*!
   * \brief An arena nobody outside holds (numpy views of a former run keep theirs busy).
   *
   * The pool keeps every arena it made, up to kPoolBytes in all (and at least two): a decode
   * loop keeping its captures holds one arena per call until it forgets them, and then the
   * next calls reuse those.  An arena allocated right after a VM run cost 8-12 us of a ~120 us
   * decode step (measured: glibc sorting the blocks the run freed), a reused one nothing.
   */
  ffi::Tensor PickArena() {
    int64_t want = plan_.dynamic ? dynamic_capacity_ : plan_.arena_bytes;
    if (want == 0) return ffi::Tensor();
    int64_t pooled = 0;
    // from the one after the last picked: a loop forgetting in bulk frees them in that order, and
    // each arena looked at is a cache miss (dozens held by a loop keeping its captures)
    for (size_t k = 0, n = pool_.size(); k < n; ++k) {
      size_t i = (next_pick_ + k) % n;
      ffi::Tensor& t = pool_[i];
      if (t.use_count() != 1) {
        pooled += t.shape()[0];
        continue;
      }
      if (t.shape()[0] < want) t = HostTensor(want, DLDataType{kDLUInt, 8, 1});  // (dynamic: grown since)
      next_pick_ = i + 1;
      return t;
    }
    ffi::Tensor fresh = HostTensor(want, DLDataType{kDLUInt, 8, 1});
    if (pool_.size() < 2 || pooled + want <= kPoolBytes) pool_.push_back(fresh);
    return fresh;
  }

  static constexpr int64_t kPoolBytes = int64_t(32) << 20;
  size_t next_pick_ = 0;  // where PickArena looks first

  Plan plan_;
  std::unordered_map<std::string, int> by_name_;
  SymbolCache symbol_cache_;
  std::vector<int> seen_;  // per symbol: calls so far in this run
  Clock::duration signal_period_;
  ffi::Tensor times_, stats_;
  double* times_data_ = nullptr;
  int64_t* stats_data_ = nullptr;
  std::vector<std::string> unexpected_;
  std::string error_;
  Clock::time_point t0_, t_call_, last_signal_check_;
  ffi::Optional<ffi::Function> on_event_;
  std::optional<ffi::Function> copy_to_bytes_, stream_sync_;
  std::map<std::pair<int64_t, int64_t>, ffi::Tensor> kept_;  // (site, position) → copy
  std::vector<ffi::Tensor> pool_;
  ffi::Tensor arena_;
  char* arena_data_ = nullptr;
  int64_t cursor_ = 0;                // dynamic arena: bytes used in this run
  int64_t dynamic_capacity_ = 4096;   // dynamic arena: the size the last run needed, at least
  bool running_ = false;  // between Begin and End
  int64_t watch_table_ = -1;  // its site table in a watched process (-1: not watched)
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

/*!
 * \brief Which session the hooked kernels of one VM report to: none between runs (they then
 * call their kernel and nothing else).  A VM whose kernels are hooks (tvm_probe/capture/kernel_hook.py)
 * has one switch; a run (HookedCall) points it at the session of its plan, and back at none after.
 */
struct HookSwitch {
  std::shared_ptr<Session> session;
  std::vector<std::string> symbols;  // of the hooks made on this switch, by hook index
  std::vector<int> ids;              // their symbol ids in `session`
  int64_t ids_of = 0;                // the session `ids` were looked up in
};

/*! \brief Switches by integer id (a VM's hooks outlive any one session). */
class Switches {
 public:
  static Switches* Global() {
    static Switches* inst = new Switches();
    return inst;
  }
  int64_t Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    switches_[++last_id_] = std::make_shared<HookSwitch>();
    return last_id_;
  }
  std::shared_ptr<HookSwitch> Get(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = switches_.find(id);
    TVM_FFI_CHECK(it != switches_.end(), ValueError) << "no tvm_probe hook switch " << id;
    return it->second;
  }
  void Close(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    switches_.erase(id);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, std::shared_ptr<HookSwitch>> switches_;
  int64_t last_id_ = 0;
};

/*! \brief `kernel` wrapped: while switch `switch_id` points at a session, each call goes
 * through Session::Hooked as a call of `symbol`. */
ffi::Function MakeHook(int64_t switch_id, const std::string& symbol, ffi::Function kernel) {
  std::shared_ptr<HookSwitch> sw = Switches::Global()->Get(switch_id);
  size_t index = sw->symbols.size();
  sw->symbols.push_back(symbol);
  sw->ids.push_back(-2);
  sw->ids_of = 0;  // a new hook: look the ids up again
  return ffi::Function::FromPacked(
      [sw, index, kernel](const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) {
        Session* session = sw->session.get();
        if (session == nullptr) {
          kernel.CallPacked(args, num_args, rv);
        } else {
          session->Hooked(sw->ids[index], kernel, args, num_args, rv);
        }
      });
}

/*! \brief Point `sw` at `session` (null: at none). */
void Point(HookSwitch* sw, std::shared_ptr<Session> session, int64_t session_id) {
  if (session != nullptr && sw->ids_of != session_id) {  // (after a run of the same plan: known)
    for (size_t i = 0; i < sw->symbols.size(); ++i) sw->ids[i] = session->SymbolId(sw->symbols[i]);
    sw->ids_of = session_id;
  }
  sw->session = std::move(session);
}

/*! \brief A run of `session` with switch `sw` pointed at it: begun when made; when it goes, whatever
 * happened, the switch points at none and the session ends. */
class PointedRun {
 public:
  PointedRun(HookSwitch* sw, std::shared_ptr<Session> session, int64_t session_id, int64_t arena_address,
             ffi::Optional<ffi::Function> on_event)
      : sw_(sw), session_(session.get()) {
    session->Begin(arena_address, std::move(on_event));
    Point(sw, std::move(session), session_id);
  }
  ~PointedRun() {
    sw_->session.reset();
    session_->End();
  }

 private:
  HookSwitch* sw_;
  Session* session_;
};

/*!
 * \brief One whole run through hooks, in one call from Python (each call across the FFI costs
 * about a microsecond, a fifth of what a 100 us decode step can spare):
 *   hooked_call(switch, session, arena_address, on_event | None, function, *args)
 * begins the session, points the switch at it, returns `function(*args)`, and points the
 * switch at none and ends the session whatever happens.
 */
void HookedCall(const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) {
  TVM_FFI_CHECK(num_args >= 5, TypeError) << "hooked_call(switch, session, arena, on_event, function, *args)";
  std::shared_ptr<HookSwitch> sw = Switches::Global()->Get(args[0].cast<int64_t>());
  int64_t session_id = args[1].cast<int64_t>();
  std::shared_ptr<Session> session = Registry::Global()->Get(session_id);
  ffi::Function function = args[4].cast<ffi::Function>();
  PointedRun run(sw.get(), session, session_id, args[2].cast<int64_t>(),
                 args[3].cast<ffi::Optional<ffi::Function>>());
  function.CallPacked(args + 5, num_args - 5, rv);
}

ffi::Function MakeInstrument(int64_t id) {
  std::shared_ptr<Session> session = Registry::Global()->Get(id);
  return ffi::Function::FromPacked(
      [session](const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) {
        session->Call(args, num_args, rv);
      });
}

/*!
 * \brief Whether objects of type `index` are TVM's KV states (`relax.vm.KVState`: the paged KV
 * cache, the RNN state), which hold memory they allocated themselves (pages, states) and copy what
 * they are given into it: a decode step returns its cache, which refers to no caller's tensor.
 */
bool IsKVState(int32_t index) {
  static std::mutex mutex;
  static std::unordered_map<int32_t, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(index);
  if (found != known.end()) return found->second;
  bool state = false;
  const TVMFFITypeInfo* info = TVMFFIGetTypeInfo(index);
  for (int32_t depth = 0; info != nullptr && depth <= info->type_depth && !state; ++depth) {
    const TVMFFITypeInfo* type = depth < info->type_depth ? info->type_ancestors[depth] : info;
    state = std::string(type->type_key.data, type->type_key.size) == "relax.vm.KVState";
  }
  return known[index] = state;
}

/*! \brief Whether `value` may hold memory in [start, end): a tensor in it, or an object
 * whose references cannot be seen (anything but tensors, shapes, strings, POD, arrays and
 * TVM's KV states). */
bool MayRefer(const ffi::AnyView& value, uintptr_t start, uintptr_t end) {
  int32_t index = value.type_index();
  if (index < ffi::TypeIndex::kTVMFFIStaticObjectBegin) {
    return index == ffi::TypeIndex::kTVMFFIDLTensorPtr;  // (a borrowed tensor: be safe)
  }
  if (index == ffi::TypeIndex::kTVMFFITensor) {
    const DLTensor* t = TVMFFITensorGetDLTensorPtr(reinterpret_cast<const TVMFFIAny*>(&value)->v_obj);
    uintptr_t data = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
    return data >= start && data < end;
  }
  if (index == ffi::TypeIndex::kTVMFFIShape || index == ffi::TypeIndex::kTVMFFIStr ||
      index == ffi::TypeIndex::kTVMFFIBytes) {
    return false;
  }
  if (index == ffi::TypeIndex::kTVMFFIArray) {
    for (const ffi::Any& item : value.cast<ffi::Array<ffi::Any>>()) {
      if (MayRefer(item, start, end)) return true;
    }
    return false;
  }
  return !IsKVState(index);
}

/*! \brief Whether `value` may hold memory of tensor `t` (see MayRefer). */
bool MayReferTo(const ffi::AnyView& value, const DLTensor& t) {
  uintptr_t start = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
  return MayRefer(value, start, start + std::max<uintptr_t>(ffi::GetDataSize(t), 1));
}

/*!
 * \brief aliases(result, tensor0, tensor1, ...) -> int: bit i set when `result` (what a VM
 * function returned) may refer to the memory of tensor i: a result handed to the caller must
 * not share memory the next call writes into (tvm_probe/capture.py, held inputs).
 */
void Aliases(const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) {
  int64_t bits = 0;
  for (int32_t i = 1; i < num_args && i <= 62; ++i) {
    const DLTensor* t = AsTensor(*reinterpret_cast<const TVMFFIAny*>(args + i));
    if (t != nullptr && MayReferTo(args[0], *t)) bits |= int64_t(1) << (i - 1);
  }
  *rv = bits;
}

// ------------------------------------------------------------------------------------- prepared call
/*! \brief One argument of a prepared call (see PreparedCall). */
struct PreparedArg {
  int32_t position = 0;  // in the function's parameter list
  bool copy = false;     // a host array copied into `held`, checked first; else passed as it is
  DLDataType dtype{};
  int32_t ndim = 0;
  int64_t shape[kMaxDims] = {};
  bool ids = false;      // integer ids that must lie in [low, bound)
  int64_t low = 0, bound = 0;
  ffi::Tensor held;      // made at first use, and again after a result referred to it
};

bool SameType(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

/*! \brief Whether host tensor `t` is what `arg` copies: its dtype and shape, compact, ids in range. */
bool Accepts(const PreparedArg& arg, const DLTensor* t) {
  if (t == nullptr || t->device.device_type != kDLCPU || !SameType(t->dtype, arg.dtype) ||
      t->ndim != arg.ndim || !ffi::IsContiguous(*t)) {
    return false;
  }
  for (int d = 0; d < arg.ndim; ++d) {
    if (t->shape[d] != arg.shape[d]) return false;
  }
  if (!arg.ids) return true;
  const char* data = static_cast<const char*>(t->data) + t->byte_offset;
  int64_t n = ffi::GetDataSize(*t) / (arg.dtype.bits / 8);
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = arg.dtype.bits == 64 ? reinterpret_cast<const int64_t*>(data)[i]
                                     : reinterpret_cast<const int32_t*>(data)[i];
    if (v < arg.low || v >= arg.bound) return false;
  }
  return true;
}

/*!
 * \brief A decode step's whole call in one native call (a ~170 us step cannot spare the
 * microseconds Python's own moving, checking and alias check cost between two VM calls):
 *
 *   call(*args)   args: the caller's arguments, the weights left out
 *
 * checks each host array against its parameter (dtype, static shape, compact, ids in range)
 * and copies it into a tensor held for it; puts every argument where the function takes it
 * among the held weights; calls the function (through the hook switch pointed at a session,
 * when hooked, as HookedCall does); gives up a held tensor the result may refer to.  What
 * happened goes into `status` (int64, read by Python as a view): [kRan] 1 when the function
 * ran, 0 when an argument was refused (nothing ran: the caller takes its checked path);
 * [kNanos] the function's wall time; [kChanged] 1 when the hooked kernels were called other
 * than the plan expects ([kExpected] calls, set when prepared); [kCopied] bytes the session copied.
 */
class PreparedCall {
 public:
  enum Status { kRan = 0, kNanos = 1, kChanged = 2, kCopied = 3, kExpected = 4, kNumStatus = 5 };

  PreparedCall(ffi::Function function, std::vector<ffi::Any> params, std::vector<PreparedArg> args)
      : function_(std::move(function)), params_(std::move(params)), args_(std::move(args)) {
    status_ = HostTensor(kNumStatus, DLDataType{kDLInt, 64, 1});
    status_data_ = static_cast<int64_t*>(status_.data_ptr());
    std::fill(status_data_, status_data_ + kNumStatus, 0);
    views_.assign(params_.begin(), params_.end());
  }

  void Hook(std::shared_ptr<HookSwitch> sw, std::shared_ptr<Session> session, int64_t session_id,
            int64_t expected_calls) {
    switch_ = std::move(sw);
    session_ = std::move(session);
    session_id_ = session_id;
    status_data_[kExpected] = expected_calls;
  }

  ffi::Tensor Status() const { return status_; }

  void Call(const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) {
    std::fill(status_data_, status_data_ + kExpected, 0);
    if (num_args != static_cast<int32_t>(args_.size())) return;
    for (int32_t i = 0; i < num_args; ++i) {
      PreparedArg& arg = args_[i];
      if (!arg.copy) {
        views_[arg.position] = args[i];
        continue;
      }
      const DLTensor* t = AsTensor(*reinterpret_cast<const TVMFFIAny*>(args + i));
      if (!Accepts(arg, t)) return;
      if (!arg.held.defined()) arg.held = HostTensorLike(*t);
      std::memcpy(arg.held.data_ptr(), static_cast<const char*>(t->data) + t->byte_offset,
                  ffi::GetDataSize(*t));
      views_[arg.position] = arg.held;
    }
    Clock::time_point t0 = Clock::now();
    if (session_ != nullptr) {
      RunHooked(rv);
    } else {
      function_.CallPacked(views_.data(), static_cast<int32_t>(views_.size()), rv);
    }
    status_data_[kNanos] = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    status_data_[kRan] = 1;
    for (PreparedArg& arg : args_) {  // the next call writes into them: a result must not share one
      if (arg.held.defined() && MayReferTo(*rv, *arg.held.GetDLTensorPtr())) arg.held = ffi::Tensor();
    }
  }

 private:
  void RunHooked(ffi::Any* rv) {
    PointedRun run(switch_.get(), session_, session_id_, 0, ffi::Optional<ffi::Function>());
    function_.CallPacked(views_.data(), static_cast<int32_t>(views_.size()), rv);
    ffi::Tensor stats = session_->Stats();
    const int64_t* s = static_cast<const int64_t*>(stats.data_ptr());
    status_data_[kChanged] = s[Session::kUnexpected] != 0 || s[Session::kStopped] != 0 ||
                             s[Session::kCalled] != status_data_[kExpected];
    status_data_[kCopied] = s[Session::kCopiedBytes];
  }

  ffi::Function function_;
  std::vector<ffi::Any> params_;      // every parameter's argument: the held weights, None elsewhere
  std::vector<PreparedArg> args_;
  std::vector<ffi::AnyView> views_;   // what the function is called with
  std::shared_ptr<HookSwitch> switch_;
  std::shared_ptr<Session> session_;
  int64_t session_id_ = 0;
  ffi::Tensor status_;
  int64_t* status_data_ = nullptr;
};

/*!
 * \brief prepare_call(function, params, spec, switch, session, expected_calls) -> [call, status]
 *
 * `params`: every parameter's argument (the held weights; None where the caller passes one).
 * `spec`: per caller argument, kPreparedWidth integers: position, copy, dtype code, bits, lanes,
 * ndim, kMaxDims dims, ids, low, bound.  `switch` and `session` 0: the function is not hooked.
 */
constexpr int kPreparedWidth = 9 + kMaxDims;

ffi::Array<ffi::Any> PrepareCall(ffi::Function function, ffi::Array<ffi::Any> params, ffi::Shape spec,
                                 int64_t switch_id, int64_t session_id, int64_t expected_calls) {
  TVM_FFI_CHECK(spec.size() % kPreparedWidth == 0, ValueError) << "malformed prepared-call spec";
  std::vector<PreparedArg> args(spec.size() / kPreparedWidth);
  for (size_t i = 0; i < args.size(); ++i) {
    const int64_t* w = spec.data() + i * kPreparedWidth;
    PreparedArg& arg = args[i];
    arg.position = static_cast<int32_t>(w[0]);
    arg.copy = w[1] != 0;
    arg.dtype = DLDataType{static_cast<uint8_t>(w[2]), static_cast<uint8_t>(w[3]), static_cast<uint16_t>(w[4])};
    arg.ndim = static_cast<int32_t>(w[5]);
    TVM_FFI_CHECK(arg.position >= 0 && static_cast<size_t>(arg.position) < params.size() &&
                  arg.ndim >= 0 && arg.ndim <= kMaxDims, ValueError) << "malformed prepared-call spec";
    std::copy(w + 6, w + 6 + kMaxDims, arg.shape);
    arg.ids = w[6 + kMaxDims] != 0;
    arg.low = w[7 + kMaxDims];
    arg.bound = w[8 + kMaxDims];
    TVM_FFI_CHECK(!arg.ids || (arg.dtype.code == kDLInt && (arg.dtype.bits == 32 || arg.dtype.bits == 64)),
                  ValueError) << "ids must be int32 or int64";
  }
  auto call = std::make_shared<PreparedCall>(std::move(function),
                                             std::vector<ffi::Any>(params.begin(), params.end()),
                                             std::move(args));
  if (session_id != 0) {
    call->Hook(Switches::Global()->Get(switch_id), Registry::Global()->Get(session_id), session_id,
               expected_calls);
  }
  ffi::Function run = ffi::Function::FromPacked(
      [call](const ffi::AnyView* args, int32_t num_args, ffi::Any* rv) { call->Call(args, num_args, rv); });
  return {run, call->Status()};
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
  def("tvm_probe.capture.times",
      Function::FromTyped([session](int64_t id) { return session(id)->Times(); }));
  def("tvm_probe.capture.stats",
      Function::FromTyped([session](int64_t id) { return session(id)->Stats(); }));
  def("tvm_probe.capture.kept",
      Function::FromTyped([session](int64_t id, int64_t site, int64_t position) {
        return session(id)->Kept(site, position);
      }));
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
  def("tvm_probe.capture.hook_switch", Function::FromTyped([]() { return Switches::Global()->Open(); }));
  def("tvm_probe.capture.hook", Function::FromTyped(MakeHook));
  def("tvm_probe.capture.hooked_call", Function::FromPacked(HookedCall));
  def("tvm_probe.capture.aliases", Function::FromPacked(Aliases));
  def("tvm_probe.capture.prepare_call", Function::FromTyped(PrepareCall));
  def("tvm_probe.capture.close_switch",
      Function::FromTyped([](int64_t id) { Switches::Global()->Close(id); }));
  def("tvm_probe.capture.close",
      Function::FromTyped([](int64_t id) { Registry::Global()->Close(id); }));
  def("tvm_probe.capture.watch_record", Function::FromTyped([](int64_t address) {
        g_in_flight = reinterpret_cast<volatile int64_t*>(address);
      }));
  def("tvm_probe.capture.watch_session",
      Function::FromTyped([session](int64_t id, int64_t table) { session(id)->Watch(table); }));
}

}  // namespace tvm_probe
