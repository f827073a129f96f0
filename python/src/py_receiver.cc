#include "py_receiver.h"

#include "py_adapters.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "sync/engine/commit/receiver.h"
#include "sync/model/layout.h"
#include "sync/model/model.h"
#include "sync/model/spec_probe.h"
#include "sync/protocol/protocol.h"

namespace py = pybind11;
namespace se = weightcast::sync::engine;

namespace weightcast::python {
namespace {

using sync::parse_runner;
using sync::Runner;
using sync::TensorMeta;

PyObject* g_receiver_error = nullptr;
PyObject* g_load_error = nullptr;

comm::Millis millis(double seconds, const char* name) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    throw comm::ConfigError(std::string(name) + " must be a positive number of seconds");
  }
  return comm::Millis(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
}

template <typename Fn>
auto parsed(Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const comm::BadRequestError& e) {
    throw se::ReceiverError(400, e.what());
  }
}

py::list views_to_python(std::span<const se::TensorView> views) {
  py::list out;
  for (const auto& v : views) {
    auto* data = const_cast<std::byte*>(v.bytes.data());
    py::memoryview mv = py::memoryview::from_memory(data, static_cast<py::ssize_t>(v.bytes.size()),
                                                    /*readonly=*/false);
    out.append(py::make_tuple(v.meta->name, std::string(sync::to_string(v.meta->dtype)),
                              py::cast(v.meta->shape), mv));
  }
  return out;
}

// A Python callable as a runner callback: the GIL is taken around the call; a Python exception
// becomes a C++ exception carrying its text (the Receiver names runner and tensor around it).
se::ReceiverRunner runner_from(const py::dict& spec) {
  se::ReceiverRunner r;
  r.id = parse_runner(spec["name"].cast<std::string>());
  r.filter = sync::NameFilter::parse(spec.contains("filter") ? spec["filter"].cast<std::string>()
                                                             : std::string("*"));
  auto hold = [](py::object fn) {
    return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* p) {
      py::gil_scoped_acquire gil;
      delete p;
    });
  };
  auto load = hold(spec["load"]);
  r.load = [load](std::span<const se::TensorView> views) {
    py::gil_scoped_acquire gil;
    try {
      (*load)(views_to_python(views));
    } catch (py::error_already_set& e) {
      // weightcast/receiver.py tags the exception with the tensor its callback was on.
      if (py::hasattr(e.value(), "weightcast_tensor") &&
          !e.value().attr("weightcast_tensor").is_none()) {
        throw se::TensorLoadFailure(e.value().attr("weightcast_tensor").cast<std::string>(),
                                    e.what());
      }
      throw std::runtime_error(e.what());
    }
  };
  for (const char* key : {"begin", "finish"}) {
    if (!spec.contains(key) || spec[key].is_none()) continue;
    auto fn = hold(spec[key]);
    std::function<void()> call = [fn] {
      py::gil_scoped_acquire gil;
      try {
        (*fn)();
      } catch (py::error_already_set& e) {
        throw std::runtime_error(e.what());
      }
    };
    (std::string(key) == "begin" ? r.begin : r.finish) = std::move(call);
  }
  if (spec.contains("shape_of") && !spec["shape_of"].is_none()) {
    auto fn = hold(spec["shape_of"]);
    r.shape_of = [fn](const std::string& name) -> std::optional<std::vector<std::int64_t>> {
      py::gil_scoped_acquire gil;
      const py::object shape = (*fn)(name);
      if (shape.is_none()) return std::nullopt;
      return shape.cast<std::vector<std::int64_t>>();
    };
  }
  return r;
}

py::dict commit_dict(const se::ReceiverCommit& c) {
  py::dict d;
  d["weight_version"] = c.weight_version;
  d["runner_digest"] = c.runner_digest;
  d["bytes_loaded"] = c.bytes_loaded;
  d["adapter"] = c.adapter;
  d["lora_digest"] = c.lora_digest;
  py::list runners;
  for (const auto& r : c.runners) {
    py::dict e;
    e["runner"] = std::string(sync::to_string(r.runner));
    e["tensors_loaded"] = r.tensors_loaded;
    e["tensors_transformed"] = r.tensors_transformed;
    runners.append(e);
  }
  d["runners"] = runners;
  return d;
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const se::LoadError& e) {
    py::object err = py::reinterpret_borrow<py::object>(g_load_error)(e.what());
    err.attr("status") = e.status();
    err.attr("runner") = std::string(sync::to_string(e.runner()));
    err.attr("tensor") = e.tensor();
    PyErr_SetObject(g_load_error, err.ptr());
  } catch (const se::ReceiverError& e) {
    py::object err = py::reinterpret_borrow<py::object>(g_receiver_error)(e.what());
    err.attr("status") = e.status();
    PyErr_SetObject(g_receiver_error, err.ptr());
  }
}

// Initial weights of the synthetic models (sync/model/model.h), as the trainer generates them:
// [(name, dtype, shape, bytes)] of a preset's target or draft runner at `step`.
// A preset name, or an HF-style config as JSON text (sync/model/model.h).
sync::ModelSpec spec_of(const std::string& model) {
  if (!model.empty() && model.front() == '{') {
    try {
      return sync::model_spec_from_json(nlohmann::json::parse(model));
    } catch (const nlohmann::json::exception& e) {
      throw comm::ConfigError(std::string("model spec: ") + e.what());
    }
  }
  return sync::model_preset(model);
}

py::list model_tensors(const std::string& preset, const std::string& runner, std::uint64_t seed,
                       std::uint64_t step) {
  const sync::ModelSpec spec = spec_of(preset);
  const auto metas = runner == "draft" ? sync::draft_tensors(spec)
                     : runner == "all" ? sync::hf_tensors(spec)
                                       : sync::target_tensors(spec);
  // Each tensor generated straight into a bytearray the caller may keep and view (writable, as
  // torch.frombuffer wants): no staging vector and no copy, each page touched once. A 1 GiB model
  // generated through a vector and copied into bytes took 8 s on a VM whose page faults are slow.
  py::list out;
  for (const auto& meta : metas) {
    const auto size = static_cast<py::ssize_t>(meta.byte_count());
    py::object raw =
        py::reinterpret_steal<py::object>(PyByteArray_FromStringAndSize(nullptr, size));
    if (!raw) throw py::error_already_set();
    sync::fill_tensor(
        meta, seed, step,
        std::span<std::byte>(reinterpret_cast<std::byte*>(PyByteArray_AsString(raw.ptr())),
                             static_cast<std::size_t>(size)));
    out.append(py::make_tuple(meta.name, std::string(sync::to_string(meta.dtype)),
                              py::cast(meta.shape), std::move(raw)));
  }
  return out;
}

// The layout transform of sync/model/layout.h applied (or undone) in place on a writable buffer:
// the torch engine's draft post-processing, non-idempotent on purpose.
void layout_in_place(const std::string& layout, bool undo, const std::string& dtype,
                     const std::vector<std::int64_t>& shape, const py::buffer& buffer) {
  py::buffer_info info = buffer.request(/*writable=*/true);
  const TensorMeta meta{"layout", parsed([&] { return sync::parse_dtype(dtype); }), shape};
  std::span<std::byte> bytes(static_cast<std::byte*>(info.ptr),
                             static_cast<std::size_t>(info.size * info.itemsize));
  WC_ENFORCE_EQ(bytes.size(), meta.byte_count(), "layout buffer");
  const sync::Layout l = sync::parse_layout(layout);
  if (undo) {
    sync::undo_layout(l, meta, bytes);
  } else {
    sync::apply_layout(l, meta, bytes);
  }
}

double spec_accept_length(const std::string& dtype, std::int64_t vocab, std::int64_t hidden,
                          const py::buffer& embed, const py::buffer& lm_head,
                          const py::buffer& fc) {
  const auto span_of = [](const py::buffer_info& i) {
    return std::span<const std::byte>(static_cast<const std::byte*>(i.ptr),
                                      static_cast<std::size_t>(i.size * i.itemsize));
  };
  const py::buffer_info e = embed.request(), l = lm_head.request(), f = fc.request();
  sync::SpecProbeInput in;
  in.dtype = sync::parse_dtype(dtype);
  in.vocab_size = vocab;
  in.hidden_size = hidden;
  in.embed = span_of(e);
  in.lm_head = span_of(l);
  in.draft_fc = span_of(f);
  py::gil_scoped_release nogil;
  return sync::run_spec_probe(in).accept_length;
}

// combined_digest() of (name, hex digest) pairs, as /weights_checksum reports a runner's digest.
std::string combined(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<sync::NamedDigest> entries;
  for (const auto& [name, hex] : pairs) {
    entries.push_back({name, parsed([&] { return sync::parse_digest(hex); })});
  }
  return sync::to_string(sync::combined_digest(std::move(entries)));
}

std::string digest_of(const py::buffer& buffer) {
  const py::buffer_info i = buffer.request();
  return sync::to_string(sync::tensor_digest(std::span<const std::byte>(
      static_cast<const std::byte*>(i.ptr), static_cast<std::size_t>(i.size * i.itemsize))));
}

std::string model_spec(const std::string& preset) {
  return sync::to_json(spec_of(preset)).dump();
}

// The module's exception types for the Receiver: ReceiverError (.status) and LoadError.
void register_receiver_errors(py::module_& m) {
  py::object base = m.attr("Error");
  g_receiver_error = PyErr_NewExceptionWithDoc(
      "weightcast._weightcast.ReceiverError",
      "A refused or failed Receiver operation; .status is the control plane's HTTP status.",
      base.ptr(), nullptr);
  m.attr("ReceiverError") = py::handle(g_receiver_error);
  g_load_error = PyErr_NewExceptionWithDoc(
      "weightcast._weightcast.LoadError",
      "A runner's load or finish raised during commit: .runner, .tensor; the version is unchanged.",
      g_receiver_error, nullptr);
  m.attr("LoadError") = py::handle(g_load_error);
  py::register_exception_translator(&translate);
}

// Model helpers the reference engine and the tests share with C++.
void bind_model_helpers(py::module_& m) {
  m.def("_layout_in_place", &layout_in_place, py::arg("layout"), py::arg("undo"), py::arg("dtype"),
        py::arg("shape"), py::arg("buffer"));
  m.def("_spec_accept_length", &spec_accept_length);
  m.def("_model_spec", &model_spec);
  m.def("_combined_digest", &combined);
  m.def("_tensor_digest", &digest_of);
  m.def("_model_tensors", &model_tensors, py::arg("preset"), py::arg("runner"), py::arg("seed"),
        py::arg("step") = 0);
}

std::unique_ptr<se::Receiver> make_receiver(int engine_rank, int rank_count, int cuda_device,
                                            const py::list& runners, bool keep_delta_base,
                                            double init_timeout, double comm_timeout,
                                            std::size_t max_bucket_bytes, std::string bind_address,
                                            std::optional<std::string> store_token,
                                            bool single_copy, std::string initial_version,
                                            int ep_size, int num_experts,
                                            const std::string& expert_placement) {
  se::ReceiverOptions o;
  o.place = {engine_rank, rank_count, cuda_device};
  o.experts = {ep_size, num_experts, sync::parse_placement_strategy(expert_placement)};
  o.keep_delta_base = keep_delta_base;
  o.init_timeout = millis(init_timeout, "init_timeout");
  o.comm_timeout = millis(comm_timeout, "comm_timeout");
  o.max_bucket_bytes = max_bucket_bytes;
  o.connect.bind_address = std::move(bind_address);
  o.connect.store_token = store_token.value_or("");
  o.connect.single_copy = single_copy;
  o.initial_version = std::move(initial_version);
  std::vector<se::ReceiverRunner> rs;
  for (const auto& r : runners) rs.push_back(runner_from(r.cast<py::dict>()));
  return std::make_unique<se::Receiver>(std::move(o), std::move(rs));
}

// Receiver.install(runner, [(name, dtype, shape, bytes-like)]): items read in place through the
// buffer protocol.
void install_tensors(se::Receiver& r, const std::string& runner, const py::list& tensors) {
  std::vector<TensorMeta> metas;
  std::vector<std::span<const std::byte>> spans;
  std::vector<py::buffer_info> infos;
  for (const auto& item : tensors) {
    auto t = item.cast<py::tuple>();
    metas.push_back(TensorMeta{t[0].cast<std::string>(),
                               parsed([&] { return sync::parse_dtype(t[1].cast<std::string>()); }),
                               t[2].cast<std::vector<std::int64_t>>()});
    infos.push_back(py::buffer(t[3]).request());
    spans.emplace_back(static_cast<const std::byte*>(infos.back().ptr),
                       static_cast<std::size_t>(infos.back().size * infos.back().itemsize));
  }
  const Runner id = parse_runner(runner);
  py::gil_scoped_release nogil;
  r.install(id, metas, spans);
}

using ReceiverClass = py::class_<se::Receiver>;

// The session and data-plane calls: join, leave, begin, receive, set_version, commit, abort,
// install.
void bind_receiver_calls(ReceiverClass& cls) {
  cls.def("join",
          [](se::Receiver& r, const std::string& body) {
            const auto req = parsed([&] { return sync::parse_init_weights_update_group(body); });
            se::GroupSpec spec{req.group_name, req.master_address, req.master_port, req.rank_offset,
                               req.world_size, req.backend,        req.rendezvous,  req.ranks};
            py::gil_scoped_release nogil;
            r.join(spec);
          })
      .def("leave",
           [](se::Receiver& r, const std::string& name) {
             py::gil_scoped_release nogil;
             r.leave(name);
           })
      .def(
          "begin",
          [](se::Receiver& r, const std::string& selector, std::optional<std::string> holder,
             bool sessionless, std::optional<std::string> lora) {
            const auto sel = parsed([&] { return sync::parse_selector(selector); });
            std::optional<se::AdapterTarget> adapter;
            if (lora) adapter = parse_adapter_begin(*lora);
            const auto b = r.begin(sel, std::move(holder), sessionless, std::move(adapter));
            py::dict d;
            for (const auto& [key, value] : {std::pair{"session_id", &b.session_id},
                                             std::pair{"weight_version", &b.weight_version},
                                             std::pair{"runner_digest", &b.runner_digest},
                                             std::pair{"lora_version", &b.lora_version},
                                             std::pair{"lora_digest", &b.lora_digest}}) {
              d[key] = *value;
            }
            return d;
          },
          py::arg("selector"), py::arg("holder") = py::none(), py::arg("sessionless") = false,
          py::arg("lora") = py::none())
      .def("receive",
           [](se::Receiver& r, const std::string& body) {
             const auto req =
                 parsed([&] { return sync::parse_update_weights_from_distributed(body); });
             py::gil_scoped_release nogil;
             return r.receive(req);
           })
      .def(
          "receive_segment",
          [](se::Receiver& r, const std::string& body, std::optional<std::string> handle_token) {
            const auto req = parsed([&] {
              return sync::parse_update_weights_from_tensor(body, sync::ProtocolLimits{});
            });
            py::gil_scoped_release nogil;
            return r.receive_segment(req, handle_token);
          },
          py::arg("body"), py::arg("handle_token") = py::none())
      .def(
          "receive_local",
          [](se::Receiver& r, const std::string& body, const py::buffer& bytes) {
            const py::buffer_info info = bytes.request();
            const auto size = static_cast<std::size_t>(info.size * info.itemsize);
            auto expected = static_cast<py::ssize_t>(info.itemsize);
            for (auto d = info.ndim; d-- > 0; expected *= info.shape[d]) {
              if (info.shape[d] > 1 && info.strides[d] != expected) {
                throw comm::ConfigError("receive_local: the bucket's bytes must be contiguous");
              }
            }
            const auto req = parsed(
                [&] { return sync::parse_local_bucket(body, size, sync::ProtocolLimits{}); });
            const std::span<const std::byte> view(static_cast<const std::byte*>(info.ptr), size);
            py::gil_scoped_release nogil;
            return r.receive_local(req, view);
          },
          py::arg("body"), py::arg("bytes"))
      .def("set_version", [](se::Receiver& r, const std::string& v) { r.set_version(v); })
      .def(
          "commit",
          [](se::Receiver& r, std::optional<std::string> version,
             std::optional<std::string> session_id) {
            se::ReceiverCommit c;
            {
              py::gil_scoped_release nogil;
              c = r.commit(version, session_id);
            }
            return commit_dict(c);
          },
          py::arg("version") = py::none(), py::arg("session_id") = py::none())
      .def(
          "abort", [](se::Receiver& r, const std::string& reason) { r.abort(reason); },
          py::arg("reason") = "aborted")
      .def("install", &install_tensors);
}

// The read-only state and the digests.
void bind_receiver_state(ReceiverClass& cls) {
  cls.def_property_readonly("weight_version", &se::Receiver::weight_version)
      .def_property_readonly("in_session", &se::Receiver::in_session)
      .def_property_readonly("sessionless", &se::Receiver::sessionless)
      .def_property_readonly("delta_base_bytes", &se::Receiver::delta_base_bytes)
      .def_property_readonly("bytes_received", &se::Receiver::bytes_received)
      .def_property_readonly("experts_dropped", &se::Receiver::experts_dropped)
      .def_property_readonly("expert_placement",
                             [](const se::Receiver& r) {
                               std::vector<std::string> out;
                               for (const auto& p : r.expert_placements())
                                 out.push_back(p.describe());
                               return out;
                             })
      .def_property_readonly("staging_pool_bytes", &se::Receiver::staging_pool_bytes)
      .def_property("keep_delta_base", &se::Receiver::keeps_delta_base,
                    &se::Receiver::set_keep_delta_base)
      .def_property_readonly("groups", &se::Receiver::groups)
      .def("digests", [](const se::Receiver& r, const std::string& runner) {
        py::dict d;
        for (const auto& [name, digest] : r.digests(parse_runner(runner)))
          d[py::str(name)] = sync::to_string(digest);
        return d;
      });
}

}  // namespace

void bind_receiver(py::module_& m) {
  register_receiver_errors(m);
  bind_model_helpers(m);
  ReceiverClass c(m, "_Receiver");
  c.def(py::init(&make_receiver), py::kw_only(), py::arg("engine_rank"), py::arg("rank_count"),
        py::arg("cuda_device"), py::arg("runners"), py::arg("keep_delta_base"),
        py::arg("init_timeout"), py::arg("comm_timeout"), py::arg("max_bucket_bytes"),
        py::arg("bind_address"), py::arg("store_token"), py::arg("single_copy"),
        py::arg("initial_version"), py::arg("ep_size") = 1, py::arg("num_experts") = 0,
        py::arg("expert_placement") = "linear");
  bind_receiver_calls(c);
  bind_receiver_state(c);
  bind_receiver_adapters(m, c);
}

}  // namespace weightcast::python
