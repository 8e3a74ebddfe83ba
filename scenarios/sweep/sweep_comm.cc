// scenarios/sweep/sweep_comm.cc: the ranks of a sweep, MPI or one process (scenarios/sweep/sweep_comm.h).
#include "scenarios/sweep/sweep_comm.h"

#include <cstdlib>
#include <cstring>
#include <limits>

#include "base/error.h"

#if defined(DSV41_HAVE_MPI)
#include <mpi.h>
#endif

namespace dsv41::scenarios::sweep {
namespace {

class LocalComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string transport() const override { return "none (one process)"; }
  std::vector<int> all_gather(int flag) override { return {flag}; }
  void send(int dest, int, const std::vector<uint8_t>&) override {
    DSV41_FAIL("sweep: no rank ", dest, " to send to (one process)");
  }
  CommMessage receive(int source) override { DSV41_FAIL("sweep: no rank ", source, " to receive from (one process)"); }
  std::optional<CommMessage> poll() override { return std::nullopt; }
  [[noreturn]] void abort_all(int code) override { std::exit(code); }
};

// Whether an MPI launcher started this process (the variables Open MPI, PMIx, MPICH/Hydra and
// Slurm's PMI set for every rank).
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

#if defined(DSV41_HAVE_MPI)
class MpiComm final : public Comm {
 public:
  MpiComm() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) MPI_Init(nullptr, nullptr);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    if (const size_t cut = v.find_first_of(",\n"); cut != std::string::npos) v = v.substr(0, cut);
    transport_ = "MPI (" + v + ")";
  }
  ~MpiComm() override { MPI_Finalize(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string transport() const override { return transport_; }
  std::vector<int> all_gather(int flag) override {
    std::vector<int> all(static_cast<size_t>(size_));
    check(MPI_Allgather(&flag, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
    return all;
  }
  void send(int dest, int tag, const std::vector<uint8_t>& bytes) override {
    DSV41_CHECK(bytes.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), "sweep: a message of ",
                bytes.size(), " bytes to rank ", dest, " is over MPI's 2 GiB count limit (an item report that large: "
                "keep fewer tensors)");
    check(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag, MPI_COMM_WORLD), "MPI_Send");
  }
  CommMessage receive(int source) override {
    MPI_Status st;
    check(MPI_Probe(source, MPI_ANY_TAG, MPI_COMM_WORLD, &st), "MPI_Probe");
    return take(st);
  }
  std::optional<CommMessage> poll() override {
    int flag = 0;
    MPI_Status st;
    check(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st), "MPI_Iprobe");
    if (!flag) return std::nullopt;
    return take(st);
  }
  [[noreturn]] void abort_all(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  CommMessage take(MPI_Status& st) {
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    CommMessage m;
    m.source = st.MPI_SOURCE;
    m.tag = st.MPI_TAG;
    m.bytes.resize(static_cast<size_t>(count));
    check(MPI_Recv(m.bytes.data(), count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Recv");
    return m;
  }
  void check(int rc, const char* what) const {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING] = {0};
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    DSV41_FAIL("sweep: rank ", rank_, ": ", what, " failed: ", std::string(msg, static_cast<size_t>(len)));
  }
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string transport_;
};
#endif

}  // namespace

bool built_with_mpi() {
#if defined(DSV41_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Comm> make_comm() {
#if defined(DSV41_HAVE_MPI)
  if (launched_by_mpi()) return std::make_unique<MpiComm>();
#else
  // A launcher started several copies of a build without MPI: each would run the whole plan and
  // race for the report. Refuse instead.
  if (launched_by_mpi()) {
    const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (size == nullptr) size = std::getenv("PMI_SIZE");
    DSV41_CHECK(size == nullptr || std::string(size) == "1", "sweep: started by an MPI launcher with ", size,
                " ranks, but this dsv41 was built without MPI (install libopenmpi-dev and reconfigure; docs/sweep.md)");
  }
#endif
  return std::make_unique<LocalComm>();
}

void ByteWriter::i64(int64_t v) {
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
}
void ByteWriter::f64(double v) {
  int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  i64(bits);
}
void ByteWriter::str(const std::string& s) {
  i64(static_cast<int64_t>(s.size()));
  bytes.insert(bytes.end(), s.begin(), s.end());
}
void ByteWriter::blob(const std::vector<uint8_t>& b) {
  i64(static_cast<int64_t>(b.size()));
  bytes.insert(bytes.end(), b.begin(), b.end());
}

void ByteReader::need(size_t n) const {
  DSV41_CHECK(n <= b_.size() - at_, "sweep: a truncated message (", b_.size(), " bytes, needed ", at_ + n, ")");
}
int64_t ByteReader::i64() {
  need(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b_[at_ + static_cast<size_t>(i)]) << (8 * i);
  at_ += 8;
  return static_cast<int64_t>(v);
}
double ByteReader::f64() {
  const int64_t bits = i64();
  double v = 0;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
std::string ByteReader::str() {
  const int64_t n = i64();
  DSV41_CHECK(n >= 0, "sweep: a message with a negative length");
  need(static_cast<size_t>(n));
  std::string s(b_.begin() + static_cast<std::ptrdiff_t>(at_), b_.begin() + static_cast<std::ptrdiff_t>(at_ + static_cast<size_t>(n)));
  at_ += static_cast<size_t>(n);
  return s;
}
std::vector<uint8_t> ByteReader::blob() {
  const int64_t n = i64();
  DSV41_CHECK(n >= 0, "sweep: a message with a negative length");
  need(static_cast<size_t>(n));
  std::vector<uint8_t> b(b_.begin() + static_cast<std::ptrdiff_t>(at_), b_.begin() + static_cast<std::ptrdiff_t>(at_ + static_cast<size_t>(n)));
  at_ += static_cast<size_t>(n);
  return b;
}

}  // namespace dsv41::scenarios::sweep
