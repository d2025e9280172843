// The knob registry (lib/core/common/include/ft/knobs.hpp): docs/knobs.md is its table, values are read
// from the environment at each read_tuning() (no cached statics), and a value that does not parse
// keeps the default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "ft/knobs.hpp"
#include "scratch_dir.hpp"

namespace {

using ft::test::read_file;

// Sets a variable for its scope and restores the previous value.
class ScopedEnv {
public:
    ScopedEnv(const char *name, const char *value) : name_(name) {
        if (const char *old = std::getenv(name)) had_ = true, old_ = old;
        if (value) setenv(name, value, 1);
        else unsetenv(name);
    }
    ~ScopedEnv() {
        if (had_) setenv(name_.c_str(), old_.c_str(), 1);
        else unsetenv(name_.c_str());
    }

private:
    std::string name_, old_;
    bool had_ = false;
};

TEST(Knobs, DocMatchesRegistry) {
    const std::string doc = read_file(std::string(FT_SOURCE_DIR) + "/docs/knobs.md");
    ASSERT_FALSE(doc.empty()) << "docs/knobs.md not found";
    const std::string begin = "<!-- knobs:begin -->\n", end = "<!-- knobs:end -->";
    const size_t a = doc.find(begin), b = doc.find(end);
    ASSERT_NE(a, std::string::npos);
    ASSERT_NE(b, std::string::npos);
    const std::string table = doc.substr(a + begin.size(), b - a - begin.size());
    EXPECT_EQ(table, ft::knobs_markdown()) << "docs/knobs.md is out of date; the table between the markers must be:\n"
                                           << ft::knobs_markdown();
}

TEST(Knobs, NamesAreUniqueAndDocumented) {
    size_t n = 0;
    const ft::KnobInfo *k = ft::knobs(&n);
    ASSERT_GT(n, 0u);
    std::set<std::string> names;
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(std::string(k[i].name).rfind("FT_", 0), 0u) << k[i].name;
        EXPECT_TRUE(names.insert(k[i].name).second) << "duplicate " << k[i].name;
        EXPECT_GT(std::string(k[i].doc).size(), 10u) << k[i].name;
        EXPECT_EQ(std::string(k[i].doc).find('|'), std::string::npos) << k[i].name << ": '|' breaks the table";
    }
}

TEST(Knobs, ReadAtEachCallNotCached) {
    {
        ScopedEnv e("FT_CPU_SPIN_US", "7");
        EXPECT_EQ(ft::read_tuning(false).cpu_spin_us, 7);
    }
    {
        ScopedEnv e("FT_CPU_SPIN_US", "9");
        EXPECT_EQ(ft::read_tuning(false).cpu_spin_us, 9);
    }
    ScopedEnv unset("FT_CPU_SPIN_US", nullptr);
    EXPECT_EQ(ft::read_tuning(false).cpu_spin_us, ft::Tuning{}.cpu_spin_us);
}

TEST(Knobs, TypesParseOrKeepTheDefault) {
    const ft::Tuning d;
    {
        ScopedEnv a("FT_CPU_PREFETCH", "12x"), b("FT_CPU_VNNI", "2"), c("FT_HANDOFF", "hostfn");
        const ft::Tuning t = ft::read_tuning(false);
        EXPECT_EQ(t.cpu_prefetch, d.cpu_prefetch);  // not an integer
        EXPECT_EQ(t.cpu_vnni, d.cpu_vnni);          // not 0 or 1
        EXPECT_EQ(t.handoff, "hostfn");
    }
    {
        ScopedEnv a("FT_CPU_PREFETCH", "0"), b("FT_CPU_VNNI", "0"), c("FT_CPU_NVFP4_W4A8", "1");
        const ft::Tuning t = ft::read_tuning(false);
        EXPECT_EQ(t.cpu_prefetch, 0);
        EXPECT_FALSE(t.cpu_vnni);
        EXPECT_TRUE(t.cpu_nvfp4_w4a8);
    }
    {
        ScopedEnv a("FT_CPU_PREFETCH", "99999999999999");  // out of int range
        EXPECT_EQ(ft::read_tuning(false).cpu_prefetch, d.cpu_prefetch);
    }
}

}  // namespace
