// Host values over the ranks: reductions, broadcasts and gathers on rank 0 of run statistics, flags,
// texts and named per-rank records (the train module's only way to talk to other ranks off the engine).
#include <climits>

#include "shardlm/dist.hpp"

namespace shardlm {

namespace {

template <typename T>
T all_reduce(MPI_Comm comm, T v, MPI_Datatype type, MPI_Op op) {
  T out{};
  check_mpi(MPI_Allreduce(&v, &out, 1, type, op, comm), "MPI_Allreduce of a run statistic");
  return out;
}

}  // namespace

int rank_of(MPI_Comm comm) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return rank;
}

int size_of(MPI_Comm comm) {
  int size = 1;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return size;
}

double mpi_sum(MPI_Comm comm, double v) { return all_reduce(comm, v, MPI_DOUBLE, MPI_SUM); }
double mpi_max(MPI_Comm comm, double v) { return all_reduce(comm, v, MPI_DOUBLE, MPI_MAX); }
double mpi_min(MPI_Comm comm, double v) { return all_reduce(comm, v, MPI_DOUBLE, MPI_MIN); }
uint64_t mpi_sum(MPI_Comm comm, uint64_t v) { return all_reduce(comm, v, MPI_UINT64_T, MPI_SUM); }
uint64_t mpi_max(MPI_Comm comm, uint64_t v) { return all_reduce(comm, v, MPI_UINT64_T, MPI_MAX); }
bool any_rank(MPI_Comm comm, bool mine) { return all_reduce(comm, mine ? 1 : 0, MPI_INT, MPI_MAX) != 0; }

void broadcast_string(std::string& text, MPI_Comm comm) {
  // The length in 64 bits: a text past MPI's int count is an error, not a wrapped count.
  unsigned long long size = rank_of(comm) == 0 ? text.size() : 0;
  MPI_Bcast(&size, 1, MPI_UNSIGNED_LONG_LONG, 0, comm);
  SHARDLM_CHECK(size <= static_cast<unsigned long long>(INT32_MAX), "broadcast_string: ", size, " bytes is too long");
  text.resize(static_cast<size_t>(size));
  MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, 0, comm);
}

void broadcast_value(long& v, MPI_Comm comm) { MPI_Bcast(&v, 1, MPI_LONG, 0, comm); }
void broadcast_value(double& v, MPI_Comm comm) { MPI_Bcast(&v, 1, MPI_DOUBLE, 0, comm); }
void broadcast_value(bool& v, MPI_Comm comm) {
  int i = v ? 1 : 0;
  MPI_Bcast(&i, 1, MPI_INT, 0, comm);
  v = i != 0;
}

std::vector<double> gather_on_root(MPI_Comm comm, double mine) {
  std::vector<double> all(rank_of(comm) == 0 ? static_cast<size_t>(size_of(comm)) : 0);
  MPI_Gather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, comm);
  return all;
}

std::vector<std::string> gather_on_root(MPI_Comm comm, const std::string& mine) {
  const int rank = rank_of(comm), world = size_of(comm);
  SHARDLM_CHECK(mine.size() <= static_cast<size_t>(INT_MAX), "gather_on_root: ", mine.size(), " bytes is too long");
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(world)), offsets(static_cast<size_t>(world), 0);
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm);
  std::string all;
  if (rank == 0) {
    size_t total = 0;
    for (int r = 0; r < world; ++r) {
      SHARDLM_CHECK(total + static_cast<size_t>(lengths[r]) <= static_cast<size_t>(INT_MAX),
                    "gather_on_root: the ranks' texts pass 2 GiB together");
      offsets[r] = static_cast<int>(total), total += static_cast<size_t>(lengths[r]);
    }
    all.resize(total);
  }
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, comm);
  std::vector<std::string> out;
  if (rank != 0) return out;
  for (int r = 0; r < world; ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r])));
  return out;
}

std::vector<NamedValues> gather_on_root(MPI_Comm comm, const NamedValues& mine) {
  const int rank = rank_of(comm), world = size_of(comm);
  const int n = static_cast<int>(mine.size());
  std::vector<double> values;
  for (const auto& [name, v] : mine) values.push_back(v);
  std::vector<double> all(rank == 0 ? static_cast<size_t>(n) * static_cast<size_t>(world) : 0);
  MPI_Gather(values.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, 0, comm);
  std::vector<NamedValues> out(rank == 0 ? static_cast<size_t>(world) : 0, mine);
  for (size_t r = 0; r < out.size(); ++r)
    for (size_t k = 0; k < mine.size(); ++k) out[r][k].second = all[r * mine.size() + k];
  return out;
}

}  // namespace shardlm
