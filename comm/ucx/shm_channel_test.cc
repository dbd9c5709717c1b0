// The same-host channel alone: two endpoints of one process over real
// shared-memory segments, driven from one thread (deterministic ring states)
// or from two (the stress case).
#include "comm/ucx/shm_channel.h"

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/store/memory_store.h"
#include "gtest/gtest.h"

namespace loom::comm::ucx {
namespace {

using internal::MakeTag;
using internal::TransportReq;

// Records what the channel hands to the other path (UCX in the transport).
class FakeOther : public ShmChannel::Other {
 public:
  struct Posted {
    TransportReq* req;
    ShmChannel::RecvEntry* entry;
  };
  struct Verdict {
    TransportReq* req;
    absl::Status error;
  };
  void PostRecv(TransportReq* req, ShmChannel::RecvEntry* entry) override {
    posted.push_back({req, entry});
  }
  void Resolved(TransportReq* req, absl::Status error) override {
    resolved.push_back({req, std::move(error)});
  }
  std::vector<Posted> posted;
  std::vector<Verdict> resolved;
};

std::string NameBase() {
  static std::atomic<int> n{0};
  return absl::StrCat("/loom-test-", getpid(), "-", n.fetch_add(1));
}

// Names in /dev/shm that start with `prefix` (no leading slash).
std::vector<std::string> ShmNames(const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (absl::StartsWith(e->d_name, prefix)) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

// Two ranks of one process, each with its own channel.
struct Pair {
  FakeOther other[2];
  std::unique_ptr<ShmChannel> ch[2];
  std::string base;
};

std::unique_ptr<Pair> Connect(const ShmChannelOptions& o0, const ShmChannelOptions& o1) {
  auto p = std::make_unique<Pair>();
  p->base = NameBase();
  MemoryStore store;
  absl::StatusOr<std::unique_ptr<ShmChannel>> r1;
  std::thread t([&] {
    r1 = ShmChannel::Connect(1, 2, store, "k/", p->base, absl::Seconds(10), o1, &p->other[1]);
  });
  absl::StatusOr<std::unique_ptr<ShmChannel>> r0 =
      ShmChannel::Connect(0, 2, store, "k/", p->base, absl::Seconds(10), o0, &p->other[0]);
  t.join();
  EXPECT_TRUE(r0.ok()) << r0.status();
  EXPECT_TRUE(r1.ok()) << r1.status();
  if (r0.ok()) p->ch[0] = std::move(*r0);
  if (r1.ok()) p->ch[1] = std::move(*r1);
  return p;
}

std::unique_ptr<Pair> Connect(const ShmChannelOptions& o = {}) { return Connect(o, o); }

// A tag from `src` with match payload `m` and signature `sig`.
uint64_t Tag(int src, uint32_t m, uint32_t sig = 0x123) { return MakeTag(1, src, false, m, sig); }

// A request and the buffer it owns.
struct Req {
  TransportReq r;
  std::vector<char> buf;
  bool done() const { return r.done.load(std::memory_order_acquire); }
  std::string text() const { return std::string(buf.begin(), buf.end()); }
};

std::unique_ptr<Req> Send(int peer, uint64_t tag, const std::string& data) {
  auto q = std::make_unique<Req>();
  q->buf.assign(data.begin(), data.end());
  q->r.is_send = true;
  q->r.peer = peer;
  q->r.tag = tag;
  q->r.buf = q->buf.data();
  q->r.bytes = q->buf.size();
  return q;
}

std::unique_ptr<Req> Recv(int peer, uint64_t tag, size_t bytes) {
  auto q = std::make_unique<Req>();
  q->buf.assign(bytes, '.');
  q->r.peer = peer;
  q->r.tag = tag;
  q->r.buf = q->buf.data();
  q->r.bytes = bytes;
  return q;
}

std::string Text(size_t n, int seed) {
  std::string s(n, ' ');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + seed) % 26);
  return s;
}

TEST(ShmChannel, SegmentsAreUnlinkedOnceMapped) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  EXPECT_TRUE(ShmNames(p->base.substr(1)).empty());
}

TEST(ShmChannel, SegmentErrorsNameTheCall) {
  absl::StatusOr<ShmSegment> s = ShmSegment::Create("/no/such/dir", 4096);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "shm_open(/no/such/dir)")) << s.status();
  s = ShmSegment::Open(NameBase(), 4096);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "shm_open(")) << s.status();
}

// Ranks that cannot map each other's segments (here: different ring sizes)
// all fall back to UCX, and leave nothing in /dev/shm.
TEST(ShmChannel, MappingFailureFallsBackEverywhere) {
  ShmChannelOptions a, b;
  b.ring_bytes = 2 * a.ring_bytes;
  auto p = Connect(a, b);
  EXPECT_EQ(p->ch[0], nullptr);
  EXPECT_EQ(p->ch[1], nullptr);
  EXPECT_TRUE(ShmNames(p->base.substr(1)).empty());
}

TEST(ShmChannel, OneSlotAndMultiSlotMessages) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  const std::vector<size_t> sizes = {0, 4, 48, 49, 112, 113, 1000, 1024};
  std::vector<std::unique_ptr<Req>> sends;
  uint64_t slots = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sends.push_back(Send(1, Tag(0, i), Text(sizes[i], i)));
    p->ch[0]->PostSend(&sends.back()->r);
    EXPECT_TRUE(sends.back()->done());  // copied: done at once
    slots += ShmChannel::SlotsFor(sizes[i]);
    EXPECT_EQ(p->ch[0]->sent_slots(1), slots) << sizes[i] << " bytes";
  }
  EXPECT_EQ(ShmChannel::SlotsFor(48), 1u);  // a header and 48 bytes: one cache line
  EXPECT_EQ(ShmChannel::SlotsFor(49), 2u);
  EXPECT_EQ(ShmChannel::SlotsFor(108), 2u);  // 60 more per slot
  EXPECT_EQ(ShmChannel::SlotsFor(109), 3u);
  EXPECT_EQ(ShmChannel::SlotsFor(1024), 18u);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto r = Recv(0, Tag(0, i), sizes[i]);
    p->ch[1]->PostRecv(&r->r);
    p->ch[1]->Progress();
    ASSERT_TRUE(r->done()) << sizes[i];
    EXPECT_TRUE(r->r.status.ok()) << r->r.status;
    EXPECT_EQ(r->text(), Text(sizes[i], i));
  }
}

TEST(ShmChannel, WrapAroundWithPadding) {
  ShmChannelOptions o;
  o.max_message_bytes = 150;  // 3 slots
  o.ring_bytes = 64;          // the minimum: 8 largest messages, 32 slots
  auto p = Connect(o);
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  ASSERT_EQ(p->ch[0]->ring_slots(), 32u);
  // Ten 3-slot messages end at slot 30; the 11th does not fit in the last
  // two, which a padding record fills: it starts at slot 0 of lap 2.
  for (int i = 0; i < 11; ++i) {
    auto s = Send(1, Tag(0, 7), Text(150, i));
    p->ch[0]->PostSend(&s->r);
    ASSERT_TRUE(s->done());
    auto r = Recv(0, Tag(0, 7), 150);
    p->ch[1]->PostRecv(&r->r);
    p->ch[1]->Progress();
    ASSERT_TRUE(r->done());
    EXPECT_EQ(r->text(), Text(150, i));
  }
  EXPECT_EQ(p->ch[0]->sent_slots(1), 30u + 2u + 3u);
  // Many laps of mixed sizes, several in flight.
  std::mt19937 rng(1);
  for (int i = 0; i < 3000; ++i) {
    const int burst = 1 + rng() % 4;
    std::vector<size_t> sizes;
    for (int b = 0; b < burst; ++b) {
      sizes.push_back(rng() % 151);
      auto s = Send(1, Tag(0, 9), Text(sizes.back(), i + b));
      p->ch[0]->PostSend(&s->r);
      ASSERT_TRUE(s->done());
    }
    for (int b = 0; b < burst; ++b) {
      auto r = Recv(0, Tag(0, 9), sizes[b]);
      p->ch[1]->PostRecv(&r->r);
      p->ch[1]->Progress();
      ASSERT_TRUE(r->done()) << i;
      ASSERT_EQ(r->text(), Text(sizes[b], i + b)) << i;
    }
  }
}

TEST(ShmChannel, FullRingSendsWaitForTheConsumer) {
  ShmChannelOptions o;
  o.max_message_bytes = 48;
  o.ring_bytes = 64;  // 8 slots
  auto p = Connect(o);
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  const size_t n = p->ch[0]->ring_slots();
  std::vector<std::unique_ptr<Req>> sends;
  for (size_t i = 0; i < n + 2; ++i) {
    sends.push_back(Send(1, Tag(0, 3), Text(40, i)));
    p->ch[0]->PostSend(&sends.back()->r);
    p->ch[0]->Progress();
    EXPECT_EQ(sends.back()->done(), i < n) << i;
  }
  // The consumer drains the ring (into its unexpected queue), the producer
  // finds room on its next progress.
  EXPECT_EQ(p->ch[1]->Progress(), static_cast<int>(n));
  p->ch[0]->Progress();
  EXPECT_TRUE(sends[n]->done() && sends[n + 1]->done());
  p->ch[1]->Progress();
  for (size_t i = 0; i < n + 2; ++i) {
    auto r = Recv(0, Tag(0, 3), 40);
    p->ch[1]->PostRecv(&r->r);
    ASSERT_TRUE(r->done());
    EXPECT_EQ(r->text(), Text(40, i)) << i;  // the order sent
  }
}

TEST(ShmChannel, ReceivePostedBeforeOrAfterArrival) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  auto before = Recv(0, Tag(0, 1), 100);
  p->ch[1]->PostRecv(&before->r);
  EXPECT_FALSE(before->done());
  auto s1 = Send(1, Tag(0, 1), Text(100, 1));
  auto s2 = Send(1, Tag(0, 2), Text(100, 2));
  p->ch[0]->PostSend(&s1->r);
  p->ch[0]->PostSend(&s2->r);
  p->ch[1]->Progress();
  ASSERT_TRUE(before->done());
  EXPECT_EQ(before->text(), Text(100, 1));
  auto after = Recv(0, Tag(0, 2), 100);
  p->ch[1]->PostRecv(&after->r);
  ASSERT_TRUE(after->done());
  EXPECT_EQ(after->text(), Text(100, 2));
}

TEST(ShmChannel, TagsMatchInAnyOrder) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  // Two receives posted in the reverse order, one receive after arrival.
  auto r3 = Recv(0, Tag(0, 3), 8), r2 = Recv(0, Tag(0, 2), 8);
  p->ch[1]->PostRecv(&r3->r);
  p->ch[1]->PostRecv(&r2->r);
  for (uint32_t m : {1, 2, 3}) {
    auto s = Send(1, Tag(0, m), Text(8, m));
    p->ch[0]->PostSend(&s->r);
  }
  p->ch[1]->Progress();
  auto r1 = Recv(0, Tag(0, 1), 8);
  p->ch[1]->PostRecv(&r1->r);
  ASSERT_TRUE(r1->done() && r2->done() && r3->done());
  EXPECT_EQ(r1->text(), Text(8, 1));
  EXPECT_EQ(r2->text(), Text(8, 2));
  EXPECT_EQ(r3->text(), Text(8, 3));
}

TEST(ShmChannel, OneMatchKeyMatchesInSendOrder) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  auto a = Recv(0, Tag(0, 5), 16);
  p->ch[1]->PostRecv(&a->r);
  for (int i = 0; i < 3; ++i) {
    auto s = Send(1, Tag(0, 5), Text(16, i));
    p->ch[0]->PostSend(&s->r);
  }
  p->ch[1]->Progress();
  auto b = Recv(0, Tag(0, 5), 16), c = Recv(0, Tag(0, 5), 16);
  p->ch[1]->PostRecv(&b->r);
  p->ch[1]->PostRecv(&c->r);
  ASSERT_TRUE(a->done() && b->done() && c->done());
  EXPECT_EQ(a->text(), Text(16, 0));
  EXPECT_EQ(b->text(), Text(16, 1));
  EXPECT_EQ(c->text(), Text(16, 2));
}

TEST(ShmChannel, SignatureAndLengthMismatches) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  struct Case {
    uint32_t send_sig, recv_sig;
    size_t sent, expected;
    absl::Status want;
  };
  const Case cases[] = {
      {0x1, 0x2, 8, 8, SignatureError(0x1, 0x2)},
      {0x1, 0x1, 8, 12, LengthError(8, 12)},
      {0x1, 0x1, 12, 8, TruncatedError(8)},
      {0x1, 0x2, 12, 8, TruncatedError(8)},  // UCX's order: truncation first
  };
  uint32_t m = 0;
  for (const Case& k : cases) {
    for (bool recv_first : {true, false}) {
      ++m;
      auto r = Recv(0, Tag(0, m, k.recv_sig), k.expected);
      auto s = Send(1, Tag(0, m, k.send_sig), Text(k.sent, 0));
      if (recv_first) p->ch[1]->PostRecv(&r->r);
      p->ch[0]->PostSend(&s->r);
      p->ch[1]->Progress();
      if (!recv_first) p->ch[1]->PostRecv(&r->r);
      ASSERT_TRUE(r->done());
      EXPECT_EQ(r->r.status, k.want);
      EXPECT_EQ(r->text(), std::string(k.expected, '.'));  // nothing written
    }
  }
}

TEST(ShmChannel, CancelledReceiveIsGoneAtOnce) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  auto r = Recv(0, Tag(0, 4), 8);
  p->ch[1]->PostRecv(&r->r);
  EXPECT_TRUE(ShmChannel::Holds(&r->r));
  p->ch[1]->Cancel(&r->r);
  EXPECT_FALSE(ShmChannel::Holds(&r->r));
  auto s = Send(1, Tag(0, 4), Text(8, 4));
  p->ch[0]->PostSend(&s->r);
  p->ch[1]->Progress();
  EXPECT_FALSE(r->done());
  EXPECT_EQ(r->text(), "........");
  auto again = Recv(0, Tag(0, 4), 8);  // the message waited for a receive
  p->ch[1]->PostRecv(&again->r);
  ASSERT_TRUE(again->done());
  EXPECT_EQ(again->text(), Text(8, 4));
}

TEST(ShmChannel, CancelledPendingSendIsDropped) {
  ShmChannelOptions o;
  o.max_message_bytes = 48;
  o.ring_bytes = 64;
  auto p = Connect(o);
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  const size_t n = p->ch[0]->ring_slots();
  std::vector<std::unique_ptr<Req>> sends;
  for (size_t i = 0; i < n; ++i) {
    sends.push_back(Send(1, Tag(0, 6), Text(8, i)));
    p->ch[0]->PostSend(&sends.back()->r);
  }
  auto dropped = Send(1, Tag(0, 6), "DROPPED!");
  p->ch[0]->PostSend(&dropped->r);
  ASSERT_FALSE(dropped->done());
  p->ch[0]->Cancel(&dropped->r);
  auto last = Send(1, Tag(0, 6), Text(8, 99));
  p->ch[0]->PostSend(&last->r);
  p->ch[1]->Progress();
  p->ch[0]->Progress();
  p->ch[1]->Progress();
  EXPECT_FALSE(dropped->done());
  ASSERT_TRUE(last->done());
  for (size_t i = 0; i <= n; ++i) {
    auto r = Recv(0, Tag(0, 6), 8);
    p->ch[1]->PostRecv(&r->r);
    ASSERT_TRUE(r->done());
    EXPECT_EQ(r->text(), i < n ? Text(8, i) : Text(8, 99)) << i;
  }
  auto none = Recv(0, Tag(0, 6), 8);
  p->ch[1]->PostRecv(&none->r);
  p->ch[1]->Progress();
  EXPECT_FALSE(none->done());
  p->ch[1]->Cancel(&none->r);
}

// Receives over the limit take their data on the other path; the channel
// keeps their place in the order (a stub from the sender).
TEST(ShmChannel, LargeReceivesKeepTheirPlace) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  FakeOther& other = p->other[1];
  const size_t big = p->ch[1]->max_message_bytes() + 1;
  // First in line: posted there at once; its stub only takes the entry.
  auto a = Recv(0, Tag(0, 1), big);
  p->ch[1]->PostRecv(&a->r);
  ASSERT_EQ(other.posted.size(), 1u);
  EXPECT_EQ(other.posted[0].req, &a->r);
  ASSERT_NE(other.posted[0].entry, nullptr);
  p->ch[0]->PostStub(1, Tag(0, 1), big);
  p->ch[1]->Progress();
  ASSERT_EQ(other.resolved.size(), 1u);
  EXPECT_EQ(other.resolved[0].req, &a->r);
  EXPECT_TRUE(other.resolved[0].error.ok());
  // A small receive that meets a stub (a send that had to catch up, or a
  // larger message): its data comes on the other path.
  auto b = Recv(0, Tag(0, 2), 8);
  p->ch[1]->PostRecv(&b->r);
  p->ch[0]->PostStub(1, Tag(0, 2), 8);
  p->ch[1]->Progress();
  ASSERT_EQ(other.posted.size(), 2u);
  EXPECT_EQ(other.posted[1].req, &b->r);
  EXPECT_EQ(other.posted[1].entry, nullptr);
  EXPECT_FALSE(ShmChannel::Holds(&b->r));
  // The same after the stub arrived first.
  p->ch[0]->PostStub(1, Tag(0, 3), big);
  p->ch[1]->Progress();
  auto c = Recv(0, Tag(0, 3), big);
  p->ch[1]->PostRecv(&c->r);
  ASSERT_EQ(other.posted.size(), 3u);
  EXPECT_EQ(other.posted[2].req, &c->r);
  EXPECT_EQ(other.posted[2].entry, nullptr);
  // A large receive that meets a small message: UCX's length error.
  auto d = Recv(0, Tag(0, 4), big);
  p->ch[1]->PostRecv(&d->r);
  auto s = Send(1, Tag(0, 4), Text(8, 0));
  p->ch[0]->PostSend(&s->r);
  p->ch[1]->Progress();
  ASSERT_EQ(other.resolved.size(), 2u);
  EXPECT_EQ(other.resolved[1].req, &d->r);
  EXPECT_EQ(other.resolved[1].error, LengthError(8, big));
  // ... and when the message came first, the receive fails at once.
  auto s2 = Send(1, Tag(0, 5), Text(8, 0));
  p->ch[0]->PostSend(&s2->r);
  p->ch[1]->Progress();
  auto e = Recv(0, Tag(0, 5), big);
  p->ch[1]->PostRecv(&e->r);
  ASSERT_TRUE(e->done());
  EXPECT_EQ(e->r.status, LengthError(8, big));
}

// A large receive behind an earlier receive of its key is posted on the
// other path only once that one is matched (UCX matches one key in posting
// order); one completed there first leaves its entry for the stub.
TEST(ShmChannel, LargeReceiveBehindItsKeyWaits) {
  auto p = Connect();
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  FakeOther& other = p->other[1];
  const size_t big = p->ch[1]->max_message_bytes() + 1;
  auto small = Recv(0, Tag(0, 1), 8), large = Recv(0, Tag(0, 1), big);
  p->ch[1]->PostRecv(&small->r);
  p->ch[1]->PostRecv(&large->r);
  EXPECT_TRUE(other.posted.empty());
  EXPECT_TRUE(ShmChannel::Holds(&large->r));
  auto s = Send(1, Tag(0, 1), Text(8, 1));
  p->ch[0]->PostSend(&s->r);
  p->ch[1]->Progress();
  ASSERT_TRUE(small->done());
  ASSERT_EQ(other.posted.size(), 1u);
  EXPECT_EQ(other.posted[0].req, &large->r);
  ASSERT_NE(other.posted[0].entry, nullptr);
  // Completed on the other path before its stub came: the stub finds the
  // entry without a request, and the next receive of the key is not fooled.
  ShmChannel::Detach(other.posted[0].entry);
  p->ch[0]->PostStub(1, Tag(0, 1), big);
  auto next = Send(1, Tag(0, 1), Text(8, 2));
  p->ch[0]->PostSend(&next->r);
  p->ch[1]->Progress();
  EXPECT_TRUE(other.resolved.empty());
  auto after = Recv(0, Tag(0, 1), 8);
  p->ch[1]->PostRecv(&after->r);
  ASSERT_TRUE(after->done());
  EXPECT_EQ(after->text(), Text(8, 2));
  // Cancelling the first receive of a key lets the deferred one go.
  auto first = Recv(0, Tag(0, 2), 8), second = Recv(0, Tag(0, 2), big);
  p->ch[1]->PostRecv(&first->r);
  p->ch[1]->PostRecv(&second->r);
  EXPECT_EQ(other.posted.size(), 1u);
  p->ch[1]->Cancel(&first->r);
  ASSERT_EQ(other.posted.size(), 2u);
  EXPECT_EQ(other.posted[1].req, &second->r);
  p->ch[1]->Remove(other.posted[1].entry);  // cancelled there
}

// Both endpoints on their own threads, both directions at once, rings
// small enough to fill.
TEST(ShmChannel, TwoThreadsBothWays) {
  ShmChannelOptions o;
  o.max_message_bytes = 300;
  o.ring_bytes = 64;
  auto p = Connect(o);
  ASSERT_TRUE(p->ch[0] && p->ch[1]);
  constexpr int kMessages = 20000;
  auto run = [&](int me) {
    ShmChannel& ch = *p->ch[me];
    const int peer = 1 - me;
    std::mt19937 rng(me);
    std::vector<std::unique_ptr<Req>> sends;
    int bad = 0;
    for (int i = 0; i < kMessages; ++i) {
      // Sizes both sides can compute: a function of the index and sender.
      const size_t out = (i * 37 + me * 11) % 301, in = (i * 37 + peer * 11) % 301;
      sends.push_back(Send(peer, Tag(me, i % 3), Text(out, i)));
      ch.PostSend(&sends.back()->r);
      auto r = Recv(peer, Tag(peer, i % 3), in);
      ch.PostRecv(&r->r);
      while (!r->done()) ch.Progress();
      if (!r->r.status.ok() || r->text() != Text(in, i)) ++bad;
      if (sends.size() > 64) {
        while (!sends.front()->done()) ch.Progress();
        sends.erase(sends.begin());
      }
    }
    for (auto& s : sends) {
      while (!s->done()) ch.Progress();
    }
    EXPECT_EQ(bad, 0) << "rank " << me;
  };
  std::thread t(run, 1);
  run(0);
  t.join();
}

}  // namespace
}  // namespace loom::comm::ucx
