#include "train/tensorboard/events.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/file_util.h"
#include "core/status_macros.h"
#include "train/tensorboard/record.h"

namespace loom::tensorboard {

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string EventFileName(double wall_time, const std::string& host, int64_t pid) {
  return absl::StrFormat("events.out.tfevents.%010d.%s.%d", static_cast<int64_t>(wall_time), host,
                         pid);
}

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Open(const std::string& dir) {
  LOOM_RETURN_IF_ERROR(checkpoint::MakeDirs(dir));
  char host[256] = "localhost";
  if (::gethostname(host, sizeof(host)) != 0) host[0] = '\0';
  host[sizeof(host) - 1] = '\0';
  const double now = WallTime();
  return Create(checkpoint::JoinPath(dir, EventFileName(now, host, ::getpid())), now);
}

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& path,
                                                                 double wall_time) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return checkpoint::ErrnoError("cannot create event file", path);
  std::unique_ptr<EventWriter> w(new EventWriter(fd, path));
  Event first;
  first.set_wall_time(wall_time);
  first.set_file_version(kFileVersion);
  w->AddEvent(first);
  LOOM_RETURN_IF_ERROR(w->Flush());  // TensorBoard lists the run at once
  return w;
}

EventWriter::~EventWriter() {
  (void)Flush();  // a clean exit leaves only whole records
  ::close(fd_);
}

void EventWriter::AddEvent(const Event& event) {
  absl::StrAppend(&pending_, FrameRecord(event.SerializeAsString()));
}

void EventWriter::AddScalar(const std::string& tag, float value, int64_t step, double wall_time) {
  Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(value);
  AddEvent(e);
}

absl::Status EventWriter::Flush() {
  size_t done = 0;
  while (done < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      pending_.erase(0, done);
      return checkpoint::ErrnoError("cannot write event file", path_);
    }
    done += n;
  }
  pending_.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Event>> ReadEvents(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::vector<std::string> records, ReadRecords(path));
  std::vector<Event> events(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    if (!events[i].ParseFromString(records[i])) {
      return absl::DataLossError(absl::StrCat(path, ": record ", i, " is not an Event proto"));
    }
  }
  return events;
}

absl::StatusOr<std::vector<Scalar>> ReadScalars(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::vector<Event> events, ReadEvents(path));
  std::vector<Scalar> scalars;
  for (const Event& e : events) {
    for (const SummaryValue& v : e.summary().value()) {
      if (v.has_simple_value()) {
        scalars.push_back({v.tag(), e.step(), v.simple_value(), e.wall_time()});
      }
    }
  }
  return scalars;
}

}  // namespace loom::tensorboard
