// The entry of matmul(): the seen call, looked up and run without the Python interpreter in between.
//
// On a host-bound call (a model's small and middle-sized projections, issued back to back) every
// step before the launch is a visible share of the call. In Python, reading the eight attributes
// that make a call's signature costs about as much as torch's own argument parsing, and one more
// frame on top of torch.mm makes matmul() slower than torch.matmul on the very shapes where cuBLAS
// wins. Here the signature is read from the at::Tensor (sizes, strides, dtypes, devices: loads, not
// Python objects) and looked up in a hash table that the Python side fills as it derives plans
// (``DirectTable.put``):
//
// * a vendor route (cuBLAS won): at::mm on the caller's tensors, as torch.mm runs it (the GIL
//   released around it, as torch's own bindings do), without torch's argument parser;
// * a launch route (a version of the series won, b = w.T): the output allocated here (at::empty) and
//   the compiled program's launch function called with the pointers, as SeriesPlan.__call__ would;
// * a Python route (a version won, b row-major [K, N], copied per call): the plan itself.
//
// A route serves every M of its bucket (the signature holds M rounded up as the choices bucket it):
// a model called at varying token counts reaches its kernel without Python from the second call of
// a bucket on. Where the bucket's version won only from some M up (the choice's ``from_m``), its
// route serves that part and the vendor route the part below (``min_rows``, ``max_rows``); a call
// on the other side of it misses, and the Python path runs its own plan. An unseen call that the checks would pass is handed to the miss hook, which queues
// its plan to be derived on a thread of its own, and runs cuBLAS (at::mm) at once, as torch.matmul
// would: the caller never waits on a derivation, a choice, a tuning or a build.
//
// A call autograd must record runs the same way where cuBLAS is its route (or the miss hook took it):
// torch's own at::mm / at::linear, recorded as torch records them, so that a training step costs the
// host what torch's does; where a kernel is its route it goes to Python, whose autograd.Function runs
// the kernel forward and backward.
//
// Every other call (not two tensors, out=, keywords, a tensor subclass or a mode that overrides
// torch functions, a signature not seen and not deferred) goes to the Python
// ``matmul`` it was routed with, which runs the full checks and derives the plan. ``linear`` (a contiguous x of any
// leading dimensions) reads the same table for x [M, K] @ weight.T, and for a bias or an activation
// the table of that variant (``DirectTable.variant``), whose routes pass the bias pointer to the
// kernel or run at::addmm and torch's activation after cuBLAS. An unseen linear() call goes to its
// own miss hook likewise, and where that takes it, runs at::addmm (or at::mm) and torch's activation
// at once.
//
// Every call, whatever it runs, first stamps the time in the word shared with the tuning child
// (``stamp_call``; yielding.py): the child puts the GPU to work only while the calls pause.
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/silu.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// What a route depends on apart from the data: the signature of a call without out= (the Python
// side's launch.signature(a, b, None)).
struct Signature {
  int64_t dims[8];  // a's sizes and strides, then b's
  int64_t kinds;    // both dtypes and both devices, packed

  bool operator==(const Signature& other) const { return std::memcmp(this, &other, sizeof(Signature)) == 0; }
};

struct SignatureHash {
  size_t operator()(const Signature& s) const {
    uint64_t h = static_cast<uint64_t>(s.kinds);
    for (int64_t d : s.dims) h = (h ^ static_cast<uint64_t>(d)) * 0x100000001b3ULL;  // FNV-1a's prime
    return static_cast<size_t>(h);
  }
};

uint64_t device_bits(const at::Device& device) {
  return (static_cast<uint64_t>(static_cast<uint8_t>(device.type())) << 8) | static_cast<uint8_t>(device.index());
}

// M rounded up as the choices bucket it (tuner.bucket): to a multiple of 2^(bit_length - 2). Every M of
// a bucket has the bucket's choice, and a vendor or launch route takes M from the call, so one
// route serves the bucket: a model called at varying token counts meets the native path, not a
// Python derivation, from the second call of a bucket on.
int64_t bucket_of(int64_t m) {
  if (m <= 0) return m;
  int bits = 64 - __builtin_clzll(static_cast<unsigned long long>(m));
  int64_t block = int64_t{1} << (bits > 2 ? bits - 2 : 0);
  return (m + block - 1) / block * block;
}

// false for what no route can take: not two strided matrices
bool signature_of(const at::Tensor& a, const at::Tensor& b, Signature* s) {
  if (a.layout() != at::kStrided || b.layout() != at::kStrided || a.is_nested() || b.is_nested() || a.dim() != 2 ||
      b.dim() != 2)
    return false;
  if (s == nullptr) return true;
  auto as = a.sizes(), at_ = a.strides(), bs = b.sizes(), bt = b.strides();
  int64_t dims[8] = {bucket_of(as[0]), as[1], at_[0], at_[1], bs[0], bs[1], bt[0], bt[1]};
  std::memcpy(s->dims, dims, sizeof dims);
  s->kinds = static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint8_t>(a.scalar_type())) |
                                  static_cast<uint64_t>(static_cast<uint8_t>(b.scalar_type())) << 8 |
                                  device_bits(a.device()) << 16 | device_bits(b.device()) << 32);
  return true;
}

// A version's compiled program, launched from here: what SeriesPlan.__call__ does for a call
// without out= and with b = w.T, without its Python (torch.empty's argument parsing alone costs
// several microseconds on a slow host).
struct Launch {
  py::object program;  // the launch function: (m, n, k, a_ptr, b_ptr, c, lda, ldb, ldc, bias_ptr)
  py::object n, k, lda, ldb, ldc, no_bias;  // made once: Python ints (no_bias: 0, the plain epilogue)
  int64_t columns, row_length;  // the result is [M, columns] in rows of row_length (16-byte padded)
  int64_t align;                // the bytes TMA needs the data pointers aligned to
};

enum class Kind { python, vendor, launch };

struct Route {
  Kind kind;
  py::object function;  // the Python function of (a, b) that computes the call (the plan)
  Launch launch;        // Kind::launch only
  // the M it serves: a Python route the one it was derived for (a plan of Python may fix M); a vendor
  // or launch route its bucket, or the part of it on one side of the choice's from_m
  int64_t min_rows, max_rows;
  int64_t tag;  // the caller's name for the choice it came from (``drop``), -1 for none
};

constexpr int64_t kAllRows = std::numeric_limits<int64_t>::max();

class DirectTable {
 public:
  explicit DirectTable(std::string activation = "") : activation_(std::move(activation)) {}
  DirectTable(const DirectTable&) = delete;  // it owns its variants' tables
  DirectTable& operator=(const DirectTable&) = delete;

  // the table of linear()'s calls with a bias (or not) and this activation: its vendor routes apply
  // them after at::addmm / at::mm; created on first use, kept for the table's life
  DirectTable& variant(bool bias, const std::string& activation) {
    auto key = std::make_pair(bias, activation);
    auto it = variants_.find(key);
    if (it == variants_.end()) it = variants_.emplace(key, std::make_unique<DirectTable>(activation)).first;
    return *it->second;
  }

  const DirectTable* find_variant(bool bias, const std::string& activation) const {
    auto it = variants_.find(std::make_pair(bias, activation));
    return it == variants_.end() ? nullptr : it->second.get();
  }

  const std::string& activation() const { return activation_; }

  void put(const at::Tensor& a, const at::Tensor& b, py::object function, int64_t tag) {
    int64_t rows = a.dim() == 2 ? a.size(0) : -1;
    insert(a, b, Route{Kind::python, std::move(function), {}, rows, rows, tag});
  }

  void put_vendor(const at::Tensor& a, const at::Tensor& b, py::object function, int64_t tag, int64_t min_rows,
                  int64_t max_rows) {
    insert(a, b, Route{Kind::vendor, std::move(function), {}, min_rows, max_rows, tag});
  }

  void put_launch(const at::Tensor& a, const at::Tensor& b, py::object function, py::object program, int64_t n,
                  int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t row_length, int64_t align,
                  int64_t columns, int64_t tag, int64_t min_rows, int64_t max_rows) {
    Launch launch{std::move(program), py::int_(n), py::int_(k),   py::int_(lda),          py::int_(ldb),
                  py::int_(ldc),      py::int_(0), columns < 0 ? n : columns, row_length, align};
    insert(a, b, Route{Kind::launch, std::move(function), std::move(launch), min_rows, max_rows, tag});
  }

  // the route's function, or None
  py::object get(const at::Tensor& a, const at::Tensor& b) const {
    const Route* route = find(a, b);
    return route ? route->function : py::none();
  }

  // "python", "vendor" or "launch", or None: what a call of this signature runs
  py::object kind(const at::Tensor& a, const at::Tensor& b) const {
    const Route* route = find(a, b);
    if (route == nullptr) return py::none();
    return py::str(route->kind == Kind::vendor ? "vendor" : route->kind == Kind::launch ? "launch" : "python");
  }

  const Route* find(const at::Tensor& a, const at::Tensor& b) const {
    Signature s;
    if (!signature_of(a, b, &s)) return nullptr;
    auto it = routes_.find(s);
    if (it == routes_.end()) return nullptr;
    const Route& route = it->second;
    return a.size(0) < route.min_rows || a.size(0) > route.max_rows ? nullptr : &route;
  }

  size_t size() const { return routes_.size(); }

  // remove the routes put with one of ``tags``, here and in the variants' tables (emptied, never
  // dropped: Python may hold them): one bucket's choice changed, the other buckets' routes stay
  void drop(const std::vector<int64_t>& tags) {
    for (auto it = routes_.begin(); it != routes_.end();) {
      if (std::find(tags.begin(), tags.end(), it->second.tag) != tags.end()) {
        it = routes_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& entry : variants_) entry.second->drop(tags);
  }

 private:
  void insert(const at::Tensor& a, const at::Tensor& b, Route route) {
    Signature s;
    if (!signature_of(a, b, &s)) throw py::value_error("a route needs two strided matrices");
    routes_[s] = std::move(route);
  }

  std::unordered_map<Signature, Route, SignatureHash> routes_;
  std::string activation_;
  std::map<std::pair<bool, std::string>, std::unique_ptr<DirectTable>> variants_;
};

// The table matmul() reads and the Python function it hands every other call to (``route``). Plain
// references, not py::object: a static py::object would be released after the interpreter is gone.
PyObject* routed_table = nullptr;  // keeps ``table`` alive while it is read
const DirectTable* table = nullptr;
PyObject* fallback = nullptr;
PyObject* linear_fallback = nullptr;  // linear()'s Python function
PyObject* miss_hook = nullptr;        // takes an unseen call's (a, b) for later, or None (see ``deferrable``)
PyObject* linear_miss_hook = nullptr;  // the same for linear(): (x2, weight.T, bias, activation)
// the device type whose unseen calls the hooks may take: CUDA (the tests route CPU calls to stand-in plans)
c10::DeviceType deferred_device = c10::DeviceType::CUDA;

// The caller's last call, in CLOCK_MONOTONIC nanoseconds, in memory shared with the tuning child
// (yielding.py); null until a tuning child is started. One relaxed store: the child only compares
// the time with its own clock, nothing is ordered by it.
int64_t* last_call_ns = nullptr;

inline void stamp_call() {
  if (last_call_ns == nullptr) return;
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);  // the vDSO's: no system call
  __atomic_store_n(last_call_ns, static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec, __ATOMIC_RELAXED);
}

// a torch.Tensor or nn.Parameter, not a subclass: a subclass may override what torch functions do
bool plain_tensor(PyObject* obj) { return THPVariable_CheckExact(obj); }

// a call that holds its own reference to ``function``: the call may re-route or drop routes of the table
PyObject* call_held(PyObject* function, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Py_INCREF(function);
  PyObject* result = PyObject_Vectorcall(function, args, nargsf, kwnames);
  Py_DECREF(function);
  return result;
}

bool aligned(const at::Tensor& t, int64_t align) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % static_cast<uintptr_t>(align) == 0;
}

// A thread's first launch makes sure a CUDA context is current on it (matmul.kernels.device_context:
// a tilus program encodes its TMA descriptors with the driver before any runtime call, and a fresh
// thread, autograd's backward thread among them, has no current context). False with a Python error.
bool context_current_on_this_thread(const at::Tensor& a) {
  static thread_local bool checked = false;
  if (checked || !a.is_cuda()) return true;
  PyObject* module = PyImport_ImportModule("matmul.kernels.device_context");
  if (module == nullptr) return false;
  PyObject* result = PyObject_CallMethod(module, "make_current", "i", static_cast<int>(a.device().index()));
  Py_DECREF(module);
  if (result == nullptr) return false;
  Py_DECREF(result);
  checked = true;
  return true;
}

// a @ b through a version's program: the output allocated, the program called with the pointers
PyObject* run_launch(const Launch& route, const at::Tensor& a, const at::Tensor& b, PyObject* bias_ptr = nullptr) {
  Launch launch = route;  // its own references: the program may re-route or drop routes of the table
  c10::OptionalDeviceGuard device_guard;
  if (a.is_cuda()) device_guard.reset_device(a.device());  // the program launches on the current device
  if (!context_current_on_this_thread(a)) return nullptr;
  int64_t rows = a.size(0);  // the call's M: the route serves its whole bucket
  at::Tensor buffer = at::empty({rows, launch.row_length}, a.options());
  PyObject* out = THPVariable_Wrap(buffer);
  if (out == nullptr) return nullptr;
  PyObject* m = PyLong_FromLongLong(rows);
  PyObject* a_ptr = PyLong_FromVoidPtr(a.data_ptr());
  PyObject* b_ptr = PyLong_FromVoidPtr(b.data_ptr());  // b = w.T: w's rows, read in place
  PyObject* result = nullptr;
  if (m != nullptr && a_ptr != nullptr && b_ptr != nullptr) {
    PyObject* argv[10] = {m,   launch.n.ptr(),   launch.k.ptr(),   a_ptr,           b_ptr,
                          out, launch.lda.ptr(), launch.ldb.ptr(), launch.ldc.ptr(), bias_ptr ? bias_ptr : launch.no_bias.ptr()};
    result = PyObject_Vectorcall(launch.program.ptr(), argv, 10, nullptr);
  }
  Py_XDECREF(m);
  Py_XDECREF(a_ptr);
  Py_XDECREF(b_ptr);
  if (result == nullptr) {
    Py_DECREF(out);
    return nullptr;
  }
  Py_DECREF(result);
  if (launch.row_length == launch.columns) return out;
  Py_DECREF(out);  // rows padded to 16 bytes: the [rows, columns] view of them
  return THPVariable_Wrap(buffer.narrow(1, 0, launch.columns));
}

bool row_major_for_tma(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, int64_t item,
                       const void* data) {
  return (col_stride == 1 || cols == 1) && ((row_stride * item) % 16 == 0 || rows == 1) &&
         reinterpret_cast<uintptr_t>(data) % 16 == 0;
}

// An unseen call that the Python checks (contract.check_call) would pass as it is: two matrices of
// one 16-bit dtype on one GPU, a [M, K] @ b [K, N], a row-major with rows TMA can read, b either the
// view w.T of such a w [N, K] or row-major itself. Such a call may run cuBLAS now and leave its
// plan to be derived off the caller's path (``miss_hook``); any other goes to the Python function,
// which names what is wrong.
bool deferrable(const at::Tensor& a, const at::Tensor& b) {
  if (a.device().type() != deferred_device || a.device() != b.device() || a.scalar_type() != b.scalar_type() ||
      (a.scalar_type() != at::kHalf && a.scalar_type() != at::kBFloat16) || a.size(1) != b.size(0) ||
      a.size(0) < 1 || a.size(1) < 1 || b.size(1) < 1)
    return false;
  int64_t item = a.element_size();
  if (!row_major_for_tma(a.size(0), a.size(1), a.stride(0), a.stride(1), item, a.data_ptr())) return false;
  bool nk = row_major_for_tma(b.size(1), b.size(0), b.stride(1), b.stride(0), item, b.data_ptr());
  bool kn = b.stride(1) == 1 || b.size(1) == 1;
  return nk || kn;
}

// cuBLAS's product, as torch.matmul runs it. Recorded by autograd (``recorded``): torch's own
// MmBackward then differentiates it, at torch's host cost, with the GIL held (a saved-tensor hook
// is Python); else without the GIL, so that the planner's thread may run meanwhile.
PyObject* vendor_mm(const at::Tensor& a, const at::Tensor& b, bool recorded) {
  at::Tensor c;
  if (recorded) {
    c = at::mm(a, b);
  } else {
    py::gil_scoped_release no_gil;
    c = at::mm(a, b);
  }
  return THPVariable_Wrap(std::move(c));
}

PyObject* matmul_entry(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  stamp_call();
  if (fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "matmul's native entry was never routed (call route(table, fallback))");
    return nullptr;
  }
  if (table != nullptr && PyVectorcall_NARGS(nargsf) == 2 && kwnames == nullptr && plain_tensor(args[0]) &&
      plain_tensor(args[1]) && !at::impl::torch_function_mode_enabled()) {
    const at::Tensor& a = THPVariable_Unpack(args[0]);
    const at::Tensor& b = THPVariable_Unpack(args[1]);
    bool recorded = at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad());
    const Route* route = table->find(a, b);
    if (route != nullptr && route->kind == Kind::vendor) return vendor_mm(a, b, recorded);
    // autograd records a kernel's product through Python (its autograd.Function, whose backward
    // runs the series' kernels too): a kernel that wins pays that host time from its own gain
    if (recorded && route != nullptr) return call_held(fallback, args, nargsf, kwnames);
    if (route != nullptr && route->kind == Kind::launch && aligned(a, route->launch.align) &&
        aligned(b, route->launch.align))
      return run_launch(route->launch, a, b);
    // a Python route, or misaligned pointers: the plan checks them and names the problem
    if (route != nullptr) return call_held(route->function.ptr(), args, 2, nullptr);
    // unseen: cuBLAS runs this call, as torch.matmul would, if the hook takes the call's plan for later
    if (miss_hook != nullptr && signature_of(a, b, nullptr) && deferrable(a, b)) {
      PyObject* taken = call_held(miss_hook, args, 2, nullptr);
      if (taken == nullptr) return nullptr;
      bool deferred = taken == Py_True;
      Py_DECREF(taken);
      if (deferred) return vendor_mm(a, b, recorded);
    }
  }
  return call_held(fallback, args, nargsf, kwnames);
  END_HANDLE_TH_ERRORS
}

// torch's kernels for an epilogue after cuBLAS (linear()'s vendor routes), as launch.VendorPlan runs them
at::Tensor activate(const at::Tensor& y, const std::string& activation) {
  if (activation.empty()) return y;
  if (activation == "relu") return at::relu(y);
  if (activation == "gelu_tanh") return at::gelu(y, "tanh");
  if (activation == "gelu_erf") return at::gelu(y);
  if (activation == "silu") return at::silu(y);
  if (activation == "swiglu") {  // gate and up interleaved in groups of 8 columns (variant.gate_up)
    at::Tensor groups = y.view({y.size(0), -1, 2, 8});
    return at::mul(at::silu(groups.select(2, 0)), groups.select(2, 1)).reshape({y.size(0), -1});
  }
  throw std::invalid_argument("unknown activation " + activation);
}

// what ``activate`` applies ("" for none): an unseen call with another name (Python's "gelu") goes to Python
bool known_activation(const std::string& activation) {
  return activation.empty() || activation == "relu" || activation == "gelu_tanh" || activation == "gelu_erf" ||
         activation == "silu" || activation == "swiglu";
}

// an unseen linear() call: true where the miss hook took its plan for later (the caller then runs
// torch's own ops at once), false where it goes to Python; null on an error the hook raised
PyObject* offer_linear(const at::Tensor& x2, const at::Tensor& w_t, PyObject* bias_obj, PyObject* activation_obj) {
  PyObject* x_obj = THPVariable_Wrap(x2);
  PyObject* w_obj = x_obj == nullptr ? nullptr : THPVariable_Wrap(w_t);
  PyObject* taken = nullptr;
  if (w_obj != nullptr) {
    PyObject* argv[4] = {x_obj, w_obj, bias_obj, activation_obj};
    taken = call_held(linear_miss_hook, argv, 4, nullptr);
  }
  Py_XDECREF(x_obj);
  Py_XDECREF(w_obj);
  return taken;
}

// linear(x, weight, bias=None, activation=None) of a seen signature: x [..., K] seen as [M, K]
// (contiguous x only: a view), the route of x2 @ weight.T in the table of its (bias, activation)
// variant, its result seen as [..., N]. An unseen call that the checks would pass and the miss hook
// takes runs torch's ops at once (as the variant's vendor route does). Every other call goes to
// linear's Python function.
PyObject* linear_entry(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  stamp_call();
  if (linear_fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "linear's native entry was never routed (call route(...))");
    return nullptr;
  }
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* bias_obj = nargs >= 3 ? args[2] : Py_None;
  PyObject* activation_obj = nargs >= 4 ? args[3] : Py_None;
  if (table == nullptr || kwnames != nullptr || nargs < 2 || nargs > 4 || !plain_tensor(args[0]) ||
      !plain_tensor(args[1]) || (bias_obj != Py_None && !plain_tensor(bias_obj)) ||
      (activation_obj != Py_None && !PyUnicode_CheckExact(activation_obj)) || at::impl::torch_function_mode_enabled())
    return call_held(linear_fallback, args, nargsf, kwnames);
  std::string activation;
  if (activation_obj != Py_None) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(activation_obj, &size);
    if (text == nullptr) return nullptr;
    activation.assign(text, static_cast<size_t>(size));
  }
  const DirectTable* routes = bias_obj == Py_None && activation.empty()
                                  ? table
                                  : table->find_variant(bias_obj != Py_None, activation);
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& weight = THPVariable_Unpack(args[1]);
  at::Tensor bias;
  if (bias_obj != Py_None) bias = THPVariable_Unpack(bias_obj);
  bool recorded = at::GradMode::is_enabled() &&
                  (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  bool plain_operands = x.layout() == at::kStrided && !x.is_nested() && x.dim() >= 2 && x.is_contiguous() &&
                        weight.layout() == at::kStrided && weight.dim() == 2;
  bool bias_fits = !bias.defined() || (bias.layout() == at::kStrided && bias.dim() == 1 &&
                                       bias.size(0) == weight.size(0) && bias.stride(0) == 1 &&
                                       bias.scalar_type() == x.scalar_type() && bias.device() == x.device());
  if (!plain_operands || !bias_fits) return call_held(linear_fallback, args, nargsf, kwnames);
  at::Tensor x2 = x.dim() == 2 ? x : x.view({-1, x.size(-1)});
  at::Tensor w_t = weight.t();
  const Route* route = routes == nullptr ? nullptr : routes->find(x2, w_t);
  bool vendor_now = route != nullptr && route->kind == Kind::vendor;
  // autograd records a kernel's product through Python (``matmul_entry`` says why)
  if (recorded && route != nullptr && !vendor_now) return call_held(linear_fallback, args, nargsf, kwnames);
  if (route == nullptr && linear_miss_hook != nullptr && known_activation(activation) && deferrable(x2, w_t)) {
    PyObject* taken = offer_linear(x2, w_t, bias_obj, activation_obj);
    if (taken == nullptr) return nullptr;
    vendor_now = taken == Py_True;
    Py_DECREF(taken);
  }
  PyObject* result = nullptr;
  if (vendor_now && recorded) {  // torch's own ops, which autograd records (``vendor_mm`` says why)
    result = THPVariable_Wrap(activate(at::linear(x2, weight, bias), activation));
  } else if (vendor_now) {
    at::Tensor c;
    {
      py::gil_scoped_release no_gil;
      c = activate(bias.defined() ? at::addmm(bias, x2, w_t) : at::mm(x2, w_t), activation);
    }
    result = THPVariable_Wrap(std::move(c));
  } else if (recorded) {  // unseen, and not one the hook took: Python records it
    return call_held(linear_fallback, args, nargsf, kwnames);
  } else if (route != nullptr && route->kind == Kind::launch && aligned(x2, route->launch.align) &&
             aligned(w_t, route->launch.align)) {
    PyObject* bias_ptr = bias.defined() ? PyLong_FromVoidPtr(bias.data_ptr()) : nullptr;
    if (bias.defined() && bias_ptr == nullptr) return nullptr;
    result = run_launch(route->launch, x2, w_t, bias_ptr);
    Py_XDECREF(bias_ptr);
  } else {
    return call_held(linear_fallback, args, nargsf, kwnames);
  }
  if (result == nullptr || x.dim() == 2) return result;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  at::Tensor c = THPVariable_Unpack(result);
  shape.back() = c.size(1);
  at::Tensor shaped = c.view(shape);  // splits M: c's rows keep their stride
  Py_DECREF(result);
  return THPVariable_Wrap(std::move(shaped));
  END_HANDLE_TH_ERRORS
}

void route(py::object new_table, py::object new_fallback, py::object new_linear_fallback, py::object new_miss,
           py::object new_linear_miss, const std::string& device_type) {
  const DirectTable* t = new_table.is_none() ? nullptr : new_table.cast<const DirectTable*>();
  if (!PyCallable_Check(new_fallback.ptr()) || !PyCallable_Check(new_linear_fallback.ptr()) ||
      (!new_miss.is_none() && !PyCallable_Check(new_miss.ptr())) ||
      (!new_linear_miss.is_none() && !PyCallable_Check(new_linear_miss.ptr())))
    throw py::type_error("the fallbacks and the miss hooks must be callable");
  c10::DeviceType new_device = c10::Device(device_type).type();  // raises on a name torch does not know
  PyObject* old_table = routed_table;
  PyObject* old_fallback = fallback;
  PyObject* old_linear_fallback = linear_fallback;
  PyObject* old_miss = miss_hook;
  PyObject* old_linear_miss = linear_miss_hook;
  routed_table = new_table.inc_ref().ptr();
  fallback = new_fallback.inc_ref().ptr();
  linear_fallback = new_linear_fallback.inc_ref().ptr();
  miss_hook = new_miss.is_none() ? nullptr : new_miss.inc_ref().ptr();
  linear_miss_hook = new_linear_miss.is_none() ? nullptr : new_linear_miss.inc_ref().ptr();
  deferred_device = new_device;
  table = t;
  Py_XDECREF(old_table);  // last: releasing them may run Python code, which may call matmul()
  Py_XDECREF(old_fallback);
  Py_XDECREF(old_linear_fallback);
  Py_XDECREF(old_miss);
  Py_XDECREF(old_linear_miss);
}

// from now on every call stores its time at ``address`` (an int64 the tuning child maps too; 0: nowhere)
void stamp_calls_into(uintptr_t address) { last_call_ns = reinterpret_cast<int64_t*>(address); }

PyMethodDef entry_methods[] = {
    {"matmul", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(matmul_entry)),
     METH_FASTCALL | METH_KEYWORDS,
     "matmul(a, b, *, out=None)\n--\n\n``a @ b``: see ``matmul.call.api``. Seen calls run from the routed "
     "table; every other call goes to the Python function it was routed with."},
    {"linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(linear_entry)),
     METH_FASTCALL | METH_KEYWORDS,
     "linear(x, weight, bias=None, activation=None)\n--\n\n``activation(x @ weight.T + bias)``: see "
     "``matmul.call.api.linear``. Seen calls without bias or activation run from the routed table."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<DirectTable>(m, "DirectTable",
                          "Routes of seen calls without out=, by signature (shapes, strides, dtypes, devices)")
      .def(py::init<std::string>(), py::arg("activation") = "")
      .def("variant", &DirectTable::variant, py::arg("bias"), py::arg("activation"),
           py::return_value_policy::reference_internal,
           "The table of linear()'s calls with (or without) a bias and this activation ('' for none)")
      .def("put", &DirectTable::put, py::arg("a"), py::arg("b"), py::arg("function"), py::arg("tag") = -1,
           "Route calls of this signature to ``function(a, b)`` (``tag``: see ``drop``)")
      .def("put_vendor", &DirectTable::put_vendor, py::arg("a"), py::arg("b"), py::arg("function"),
           py::arg("tag") = -1, py::arg("min_rows") = 0, py::arg("max_rows") = kAllRows,
           "Route calls of this signature with M in [min_rows, max_rows] to at::mm (``function`` is what ``get`` "
           "returns)")
      .def("put_launch", &DirectTable::put_launch, py::arg("a"), py::arg("b"), py::arg("function"),
           py::arg("program"), py::arg("n"), py::arg("k"), py::arg("lda"), py::arg("ldb"),
           py::arg("ldc"), py::arg("row_length"), py::arg("align"), py::arg("columns") = -1, py::arg("tag") = -1,
           py::arg("min_rows") = 0, py::arg("max_rows") = kAllRows,
           "Route calls of this signature (M in [min_rows, max_rows] of its bucket) to ``program(m, n, k, a_ptr, b_ptr, c, lda, ldb, "
           "ldc, bias_ptr)`` on a new [m, row_length] c of ``columns`` (default n) columns; calls whose pointers are not "
           "``align``-byte aligned to ``function(a, b)``")
      .def("get", &DirectTable::get, py::arg("a"), py::arg("b"))
      .def("kind", &DirectTable::kind, py::arg("a"), py::arg("b"))
      .def("drop", &DirectTable::drop, py::arg("tags"),
           "Remove the routes put with one of ``tags`` (an int each), here and in the variants' tables")
      .def("__len__", &DirectTable::size);
  m.def("route", &route, py::arg("table"), py::arg("fallback"), py::arg("linear_fallback"),
        py::arg("miss") = py::none(), py::arg("linear_miss") = py::none(), py::arg("deferred_device") = "cuda",
        "Make matmul() and linear() read ``table`` (a DirectTable, or None for none) and hand every other call "
        "to ``fallback`` (matmul's) or ``linear_fallback``; an unseen matmul() call that the checks would pass "
        "first to ``miss(a, b)``, and where that returns True, to at::mm (cuBLAS) at once; an unseen linear() call "
        "likewise to ``linear_miss(x2, weight.T, bias, activation)``, then at::addmm or at::mm and torch's "
        "activation. Only calls on ``deferred_device`` (a device type) are offered to the hooks.");
  m.def("stamp_calls_into", &stamp_calls_into, py::arg("address"),
        "Every later call stores its CLOCK_MONOTONIC time in nanoseconds in the int64 at ``address`` (0: stop)");
  if (PyModule_AddFunctions(m.ptr(), entry_methods) != 0) throw py::error_already_set();
}
