// `dsv41 exact`: each float-output op of the ops seam on seeded random and adversarial inputs,
// each backend's error against the exact evaluation (scenarios/exact/exact_eval.h), the derived bound,
// its two checks (not exceeded, not vacuous) and which side is closer. Exit 1 when a bound is
// exceeded. docs/cli.md, docs/cuda.md "Tolerances with their origin".
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "reports/h5_writer.h"
#include "scenarios/cli/cli.h"
#include "scenarios/exact/exact_eval.h"
#if defined(DSV41_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#endif

namespace dsv41::scenarios::cli {
namespace {

using exact::OpCase;
using exact::SideError;

struct Side {
  std::string name;
  std::unique_ptr<reference::seam::Ops> owned;  // the cuda ops (the reference's are a singleton)
  const reference::seam::Ops* ops = nullptr;
  bool production = false;  // runs production kernels (cuda): linear F8 judged by the tensor-core bound
};

Side make_side(const std::string& name) {
  Side s;
  s.name = name;
  if (name == "ref") {
    s.ops = &reference::seam::reference_ops();
    return s;
  }
  if (name == "cuda" || name == "cuda-exact") {
#if defined(DSV41_HAVE_CUDA)
    s.production = name == "cuda";
    s.owned = std::make_unique<gpu::CudaOps>(s.production ? gpu::CudaMode::kProduction : gpu::CudaMode::kExact);
    s.ops = s.owned.get();
    return s;
#else
    DSV41_FAIL("exact: backend ", name, ": this build has no CUDA path (configured without nvcc; DSV41_HAVE_CUDA is off)");
#endif
  }
  DSV41_FAIL("exact: unknown backend '", name, "' (known: ref, cuda-exact, cuda)");
}

std::string fmt(double v, const char* f = "%.3g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

int run_exact(std::ostream& out, const std::vector<std::string>& backends, const std::string& sizes, uint64_t seed,
              const std::string& h5_path) {
  DSV41_CHECK(!backends.empty() && backends.size() <= 2, "exact: give one or two backends (--backend ref,cuda)");
  std::vector<Side> sides;
  bool production = false;
  for (const std::string& b : backends) {
    sides.push_back(make_side(b));
    production = production || sides.back().production;
  }
  out << "exact: seed " << seed << " (--seed to override), sizes " << sizes << ", backends";
  for (const Side& s : sides) out << " " << s.name;
  out << "\n";
  const std::vector<OpCase> cases = exact::make_cases(exact::parse_sizes(sizes), seed);

  // Columns: op, inputs, n, outputs, out dtype, bound (median / max in output ulps),
  // per side max error (ulps, relative) and used = max err / bound, the checks, closer.
  out << "op                   inputs  n       outputs dtype bound_med_ulp bound_max_ulp";
  for (const Side& s : sides) out << " | " << s.name << "_max_ulp " << s.name << "_max_rel " << s.name << "_used";
  out << " | exceeded vacuous closer\n";
  int64_t exceeded_total = 0, vacuous_total = 0, errors_total = 0;
  std::vector<std::string> col_op, col_inputs, col_closer;
  std::vector<int64_t> col_n, col_count, col_exceeded;
  std::vector<double> col_bmed, col_bmax;
  std::vector<std::vector<double>> col_ulps(sides.size()), col_rel(sides.size()), col_used(sides.size());
  for (const OpCase& each : cases) {
    // With a production side, linear F8 is judged by the fp8 tensor-core bound and sparse_attn by the
    // larger of its exact bound and the bf16 tensor-core kernel's (both sides).
    const OpCase judged = production ? exact::with_tensor_core_bound(each) : OpCase{};
    const OpCase& c = production ? judged : each;
    const exact::BoundStats b = exact::bound_stats(c);
    std::vector<SideError> errs;
    std::string failure;
    for (const Side& s : sides) {
      try {
        errs.push_back(exact::measure(c, *s.ops, s.name));
      } catch (const dsv41::Error& e) {  // one op failing on one side: reported, the run goes on
        failure += " " + s.name + ": " + e.what();
      }
    }
    if (!failure.empty()) {
      out << c.op << " / " << c.inputs << ": ERROR" << failure << "\n";
      ++errors_total;
      continue;
    }
    int64_t exceeded = 0;
    for (const SideError& e : errs) exceeded += e.exceeded;
    std::string closer = "-";
    if (errs.size() == 2) {
      const exact::Closer cl = exact::closer(c, errs[0], errs[1]);
      closer = cl.verdict == "equal" ? "equal"
                                     : cl.verdict + " (" + std::to_string(cl.a_closer) + "/" + std::to_string(cl.b_closer) + ")";
    }
    char head[160];
    std::snprintf(head, sizeof head, "%-20s %-7s %-7lld %-7zu %-5s %-13s %-13s", c.op.c_str(), c.inputs.c_str(),
                  static_cast<long long>(c.reduction), c.exact.size(), c.out.name,
                  c.bounded && !c.flags ? fmt(b.median_ulps).c_str() : "n/a",
                  c.bounded && !c.flags ? fmt(b.max_ulps).c_str() : "n/a");
    out << head;
    for (size_t i = 0; i < errs.size(); ++i) {
      out << " | " << fmt(errs[i].max_ulps) << " " << fmt(errs[i].max_rel) << " " << (c.bounded ? fmt(errs[i].used) : "n/a");
      col_ulps[i].push_back(errs[i].max_ulps);
      col_rel[i].push_back(errs[i].max_rel);
      col_used[i].push_back(errs[i].used);
    }
    if (c.bounded) {
      out << " | " << (exceeded ? "EXCEEDED(" + std::to_string(exceeded) + ")" : "no") << " "
          << (b.vacuous ? "VACUOUS" : "no") << " " << closer << "\n";
    } else {
      out << " | n/a n/a " << closer << "  (no bound derived: measured only)\n";
    }
    exceeded_total += exceeded;
    vacuous_total += b.vacuous ? 1 : 0;
    col_op.push_back(c.op);
    col_inputs.push_back(c.inputs);
    col_closer.push_back(closer);
    col_n.push_back(c.reduction);
    col_count.push_back(static_cast<int64_t>(c.exact.size()));
    col_exceeded.push_back(exceeded);
    col_bmed.push_back(b.median_ulps);
    col_bmax.push_back(b.max_ulps);
  }
  out << "exact: " << cases.size() << " cases; bounds exceeded on " << exceeded_total << " outputs; " << vacuous_total
      << " vacuous bounds; " << errors_total << " cases failed to run\n";
  if (!h5_path.empty()) {
    reports::H5Writer w(h5_path);
    const std::vector<int64_t> shape{static_cast<int64_t>(cases.size())};
    w.attr("/", "tool", "dsv41 exact");
    w.attr("/", "seed", seed);
    w.attr("/", "sizes", sizes);
    w.write_strings("/op", col_op);
    w.write_strings("/inputs", col_inputs);
    w.write_strings("/closer", col_closer);
    w.write("/reduction", col_n, shape);
    w.write("/outputs", col_count, shape);
    w.write("/exceeded", col_exceeded, shape);
    w.write("/bound_median_ulps", col_bmed, shape);
    w.write("/bound_max_ulps", col_bmax, shape);
    for (size_t i = 0; i < sides.size(); ++i) {
      // A backend named twice (ref,ref: the tool against itself) gets "<name>_b" for the second.
      const std::string group = "/" + sides[i].name + (i == 1 && sides[1].name == sides[0].name ? "_b" : "");
      w.write(group + "/max_ulps", col_ulps[i], shape);
      w.write(group + "/max_rel", col_rel[i], shape);
      w.write(group + "/used", col_used[i], shape);
    }
    w.commit();
    out << "exact: wrote " << h5_path << "\n";
  }
  // A vacuous bound is a weakness of the derivation, not a defect of a backend: reported, and
  // asserted absent at the tiny sizes by tests/scenarios/exact/exact_eval_test.cc.
  return exceeded_total || errors_total ? runner::kExitCheckFailed : runner::kExitOk;
}

Verb add_exact_verb(CLI::App& parent) {
  struct Args {
    std::string backend = "ref", sizes = "tiny", output;
    uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "exact", "each float op's error against an exact evaluation, checked against its derived bound");
  app->add_option("--backend", a->backend,
                  "ref, cuda-exact, cuda (production) or two of them, e.g. ref,cuda (default ref)");
  seed_option(app->add_option("--seed", a->seed, "input seed (printed; default 1)"));
  app->add_option("--sizes", a->sizes, "tiny (the tiny preset's dims) or small (longer reductions)");
  app->add_option("-o,--output", a->output, "write the per-case numbers to this HDF5 file");
  return {app, [a] {
            std::vector<std::string> backends;
            std::stringstream ss(a->backend);
            for (std::string b; std::getline(ss, b, ',');) backends.push_back(b);
            return run_exact(std::cout, backends, a->sizes, a->seed, a->output);
          }};
}

}  // namespace dsv41::scenarios::cli
