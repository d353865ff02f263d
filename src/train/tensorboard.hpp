// TensorBoard event files written by hand: TFRecord framing (length, masked CRC32C of the length,
// the record, masked CRC32C of the record) around Event protocol buffers holding scalar summaries.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardlm {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) as TFRecord uses it, and its masked form
// ((crc >> 15 | crc << 17) + 0xa282ead8).
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// One record framed as TFRecord: uint64 length, masked CRC of those 8 bytes, data, masked CRC of data.
std::string tfrecord_frame(const std::string& data);

// Event protos (tensorflow/core/util/event.proto): the first record of a file carries file_version
// "brain.Event:2"; the others a Summary of simple_value scalars, tag by tag.
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

// RUN_DIR/tensorboard/events.out.tfevents.<seconds>.<host>: a new file each time a run (or its
// resume) starts, as TensorBoard expects; every record is one write(), so `tensorboard --logdir`
// follows the run. Error naming the file when it cannot be written.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& folder);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  int fd_ = -1;
  std::string path_;
};

}  // namespace shardlm
