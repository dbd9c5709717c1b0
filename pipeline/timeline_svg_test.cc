#include "pipeline/timeline_svg.h"

#include <cctype>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "pipeline/timeline_text.h"

namespace loom::pipeline {
namespace {

// One start tag of the document: its name and attributes.
struct Tag {
  std::string name;
  std::map<std::string, std::string> attrs;
};

// A minimal XML well-formedness checker: tags balance, attributes are name="value", no stray
// '<' or '&' in text. Collects every start tag. Returns "" when well-formed, else why not.
std::string CheckXml(const std::string& doc, std::vector<Tag>* tags) {
  std::vector<std::string> open;
  size_t i = 0;
  int roots = 0;
  while (i < doc.size()) {
    if (doc[i] != '<') {
      if (doc[i] == '&') {
        const size_t semi = doc.find(';', i);
        if (semi == std::string::npos || semi - i > 6) return "bare '&' at " + std::to_string(i);
      }
      if (open.empty() && !isspace(static_cast<unsigned char>(doc[i]))) {
        return "text outside the root at " + std::to_string(i);
      }
      ++i;
      continue;
    }
    if (doc.compare(i, 5, "<?xml") == 0) {
      const size_t end = doc.find("?>", i);
      if (end == std::string::npos) return "unterminated <?xml";
      i = end + 2;
      continue;
    }
    if (doc.compare(i, 4, "<!--") == 0) {
      const size_t end = doc.find("-->", i);
      if (end == std::string::npos) return "unterminated comment";
      i = end + 3;
      continue;
    }
    const size_t end = doc.find('>', i);
    if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
    std::string body = doc.substr(i + 1, end - i - 1);
    if (body.find('<') != std::string::npos) return "'<' inside a tag at " + std::to_string(i);
    i = end + 1;
    if (!body.empty() && body[0] == '/') {
      const std::string name = body.substr(1);
      if (open.empty() || open.back() != name) {
        return "</" + name + "> closes " + (open.empty() ? "nothing" : "<" + open.back() + ">");
      }
      open.pop_back();
      continue;
    }
    const bool self_closing = !body.empty() && body.back() == '/';
    if (self_closing) body.pop_back();
    Tag tag;
    size_t p = 0;
    while (p < body.size() && !isspace(static_cast<unsigned char>(body[p]))) ++p;
    tag.name = body.substr(0, p);
    if (tag.name.empty()) return "empty tag name";
    while (p < body.size()) {
      while (p < body.size() && isspace(static_cast<unsigned char>(body[p]))) ++p;
      if (p >= body.size()) break;
      const size_t eq = body.find('=', p);
      if (eq == std::string::npos || eq + 1 >= body.size() || body[eq + 1] != '"') {
        return "attribute without =\"...\" in <" + tag.name + ">";
      }
      const size_t close = body.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute in <" + tag.name + ">";
      const std::string key = body.substr(p, eq - p);
      if (tag.attrs.count(key)) return "duplicate attribute " + key;
      tag.attrs[key] = body.substr(eq + 2, close - eq - 2);
      p = close + 1;
    }
    if (open.empty()) ++roots;
    tags->push_back(tag);
    if (!self_closing) open.push_back(tag.name);
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  if (roots != 1) return "expected one root element, found " + std::to_string(roots);
  return "";
}

TEST(TimelineSvgTest, CheckerCatchesBrokenXml) {
  std::vector<Tag> tags;
  EXPECT_EQ(CheckXml("<a><b/></a>", &tags), "");
  EXPECT_NE(CheckXml("<a><b></a>", &tags), "");
  EXPECT_NE(CheckXml("<a x=1></a>", &tags), "");
  EXPECT_NE(CheckXml("<a>x & y</a>", &tags), "");
  EXPECT_NE(CheckXml("<a></a><b></b>", &tags), "");
}

TEST(TimelineSvgTest, WellFormedWithTwoMVBoxesPerStage) {
  for (auto [kind, pp, vp, m] : std::vector<std::tuple<ScheduleKind, int, int, int>>{
           {ScheduleKind::kInterleaved, 4, 2, 8},
           {ScheduleKind::k1F1B, 4, 1, 8},
           {ScheduleKind::kGPipe, 3, 1, 5},
           {ScheduleKind::kInterleaved, 2, 3, 4}}) {
    ScheduleOptions o;
    o.kind = kind;
    o.pp = pp;
    o.vp = vp;
    o.micro_batches = m;
    const Schedule s = *BuildSchedule(o);
    const SimResult r = *Simulate(s);
    timeline::SvgOptions opt;
    opt.subtitle = "f=1 & b=2 <check escaping>";
    const std::string svg = RenderTimelineSvg(s, r, opt);

    std::vector<Tag> tags;
    ASSERT_EQ(CheckXml(svg, &tags), "") << svg;
    ASSERT_FALSE(tags.empty());
    EXPECT_EQ(tags[0].name, "svg");
    std::map<int, int> fwd, bwd;
    for (const Tag& t : tags) {
      if (t.name != "rect" || !t.attrs.count("class")) continue;
      const std::string& cls = t.attrs.at("class");
      if (cls != "fwd" && cls != "bwd") continue;
      const int stage = std::stoi(t.attrs.at("data-stage"));
      (cls == "fwd" ? fwd : bwd)[stage]++;
      EXPECT_GT(std::stod(t.attrs.at("width")), 0);
    }
    ASSERT_EQ(static_cast<int>(fwd.size()), pp);
    for (int st = 0; st < pp; ++st) {
      EXPECT_EQ(fwd[st], m * vp) << "stage " << st;
      EXPECT_EQ(bwd[st], m * vp) << "stage " << st;
    }
    EXPECT_NE(svg.find("bubble"), std::string::npos);
    EXPECT_NE(svg.find("&amp; b=2 &lt;check escaping&gt;"), std::string::npos);
  }
}

TEST(TimelineSvgTest, TitleCarriesTheBubbleFraction) {
  ScheduleOptions o;
  o.kind = ScheduleKind::kInterleaved;
  o.pp = 4;
  o.vp = 2;
  o.micro_batches = 8;
  const Schedule s = *BuildSchedule(o);
  const std::string svg = RenderTimelineSvg(s, *Simulate(s));
  EXPECT_NE(svg.find("bubble 0.1875"), std::string::npos) << svg.substr(0, 600);
}

TEST(TimelineSvgTest, SplitBackwardDrawsInputAndWeightGradsApart) {
  for (auto [kind, pp, vp, m] : std::vector<std::tuple<ScheduleKind, int, int, int>>{
           {ScheduleKind::kZBH1, 4, 1, 8}, {ScheduleKind::kZBV, 4, 2, 8}}) {
    ScheduleOptions o;
    o.kind = kind;
    o.pp = pp;
    o.vp = vp;
    o.micro_batches = m;
    const Schedule s = *BuildSchedule(o);
    const SimResult r = *Simulate(s);
    const std::string svg = RenderTimelineSvg(s, r);
    std::vector<Tag> tags;
    ASSERT_EQ(CheckXml(svg, &tags), "") << svg;
    std::map<std::string, std::map<int, int>> per_class;
    for (const Tag& t : tags) {
      if (t.name != "rect" || !t.attrs.count("class") || !t.attrs.count("data-stage")) continue;
      per_class[t.attrs.at("class")][std::stoi(t.attrs.at("data-stage"))]++;
    }
    EXPECT_EQ(per_class.count("bwd"), 0u);
    for (const char* cls : {"fwd", "bwd-input", "bwd-weight"}) {
      for (int st = 0; st < pp; ++st) EXPECT_EQ(per_class[cls][st], m * vp) << cls << " " << st;
    }
    EXPECT_NE(svg.find("weight grad (W)"), std::string::npos);
    EXPECT_NE(svg.find(kind == ScheduleKind::kZBH1 ? "(P-1)/(3M)" : "(P-1)/(6M)"),
              std::string::npos);
    // With F = I = W these simulated bubbles equal the formula in the title (simulator_test).
    EXPECT_NE(svg.find(absl::StrFormat("bubble %.4f (textbook", r.bubble_fraction)),
              std::string::npos);
    EXPECT_NEAR(r.bubble_fraction, TheoreticalBubble(o), 1e-12);
  }
}

}  // namespace
}  // namespace loom::pipeline
