#ifndef LOOM_TRAIN_TENSORBOARD_EVENTS_H_
#define LOOM_TRAIN_TENSORBOARD_EVENTS_H_

// TensorBoard event files without TensorFlow: Event protos (event.proto, wire
// compatible with TensorBoard's) in TFRecord framing (record.h).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/tensorboard/event.pb.h"

namespace loom::tensorboard {

// The first record of every event file: TensorBoard's readers check it.
inline constexpr char kFileVersion[] = "brain.Event:2";

// Seconds since the epoch, as an Event's wall_time.
double WallTime();

// TensorBoard's name for a new file: events.out.tfevents.<seconds, 10
// digits>.<host>.<pid> (its readers only need the "tfevents" part; the rest
// keeps two writers of one folder apart).
std::string EventFileName(double wall_time, const std::string& host, int64_t pid);

// Appends events to one file. Records are buffered and written whole by
// Flush() (and the destructor), so the file never ends in half a record
// unless the process dies inside a write.
class EventWriter {
 public:
  // Creates `dir` (mkdir -p) and a new file named by EventFileName (now,
  // this host, this process) in it.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Open(const std::string& dir);
  // Creates (truncates) exactly `path`; its file_version record carries
  // `wall_time` (tests give fixed times).
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& path,
                                                             double wall_time);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Summary with one simple_value: what Megatron's SummaryWriter.add_scalar writes.
  void AddScalar(const std::string& tag, float value, int64_t step, double wall_time);
  void AddEvent(const Event& event);
  // Writes what is buffered; errors name the file.
  absl::Status Flush();
  const std::string& path() const { return path_; }

 private:
  EventWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
  std::string pending_;  // framed records not yet written
};

// Every event of a file, every CRC checked (DataLoss naming the file).
absl::StatusOr<std::vector<Event>> ReadEvents(const std::string& path);

struct Scalar {
  std::string tag;
  int64_t step = 0;
  float value = 0;
  double wall_time = 0;
};
// The simple_value scalars of a file, in file order.
absl::StatusOr<std::vector<Scalar>> ReadScalars(const std::string& path);

}  // namespace loom::tensorboard

#endif  // LOOM_TRAIN_TENSORBOARD_EVENTS_H_
