// scenarios/sweep/sweep_comm.h
//
// The ranks of a sweep (docs/sweep.md) and the few messages they exchange. With MPI (the build
// found it: DSV41_HAVE_MPI) and a process started by an MPI launcher (mpirun, mpiexec, srun:
// detected by the variables they set, OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK, PMI_SIZE), the
// ranks are MPI_COMM_WORLD; otherwise there is one rank and MPI is never initialized, so
// `dsv41 sweep` started by hand needs no MPI runtime at all.
//
// Messages are byte strings with a tag, point to point; rank 0 polls (Iprobe) because it also
// watches its own item process between messages.
//
// Example:
//   std::unique_ptr<Comm> comm = make_comm(&argc, &argv);
//   if (comm->rank() == 0) { ... comm->poll() ... } else { comm->send(0, kTagRequest, {}); ... }
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dsv41::scenarios::sweep {

struct CommMessage {
  int source = -1;
  int tag = -1;
  std::vector<uint8_t> bytes;
};

class Comm {
 public:
  virtual ~Comm() = default;  // the MPI one finalizes MPI
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks of this host
  virtual int local_size() const = 0;
  virtual std::string transport() const = 0;  // "MPI (<library version>)" or "none (one process)"
  // Every rank's flag, in rank order (collective).
  virtual std::vector<int> all_gather(int flag) = 0;
  virtual void send(int dest, int tag, const std::vector<uint8_t>& bytes) = 0;
  virtual CommMessage receive(int source) = 0;       // blocking, from `source`
  virtual std::optional<CommMessage> poll() = 0;     // a pending message from anyone, or nothing
  // Ends every rank now (an error left a rank unable to go on; the others would wait forever).
  [[noreturn]] virtual void abort_all(int code) = 0;
};

// MPI when built with it and started by a launcher, else one rank (above).
std::unique_ptr<Comm> make_comm();
// Whether this build has MPI (for --help and the docs' checks).
bool built_with_mpi();

// A small byte encoding for the messages (little-endian fixed widths, strings length-prefixed).
class ByteWriter {
 public:
  void i64(int64_t v);
  void f64(double v);
  void str(const std::string& s);
  void blob(const std::vector<uint8_t>& b);
  std::vector<uint8_t> bytes;
};
class ByteReader {
 public:
  explicit ByteReader(const std::vector<uint8_t>& b) : b_(b) {}
  int64_t i64();
  double f64();
  std::string str();
  std::vector<uint8_t> blob();

 private:
  void need(size_t n) const;
  const std::vector<uint8_t>& b_;
  size_t at_ = 0;
};

}  // namespace dsv41::scenarios::sweep
