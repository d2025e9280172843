// Knobs reach an engine when it is created: a setenv between two ft_engine_create calls changes
// the second engine only (docs/knobs.md), and a knob set to a value it cannot take is reported.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "freetoken.h"

namespace {

std::string engine_isa() {
    ft_engine_params p;
    ft_engine_params_init(&p);
    p.device = FT_DEVICE_NONE;
    p.cpu_threads = 1;
    ft_engine *e = nullptr;
    char err[256];
    if (ft_engine_create(&p, &e, err, sizeof err) != FT_OK) return std::string("error: ") + err;
    ft_engine_info info;
    info.struct_size = sizeof info;
    const ft_status s = ft_engine_get_info(e, &info);
    std::string isa = s == FT_OK ? info.cpu_isa : "error";
    ft_engine_free(e);
    return isa;
}

TEST(KnobsApi, EachEngineReadsTheEnvironmentAtCreation) {
    const char *old = std::getenv("FT_CPU_ISA");
    const std::string saved = old ? old : "";
    unsetenv("FT_CPU_ISA");
    const std::string best = engine_isa();
    setenv("FT_CPU_ISA", "scalar", 1);
    EXPECT_EQ(engine_isa(), "scalar");
    unsetenv("FT_CPU_ISA");
    EXPECT_EQ(engine_isa(), best);
    if (old) setenv("FT_CPU_ISA", saved.c_str(), 1);
}

}  // namespace
