/* The ABI seen from C: struct sizes and offsets are pinned (a change here is an ABI break and
 * needs a new major version), old callers with a smaller struct_size get defaults for what they
 * do not know, output structs are written only up to struct_size, and bad handles/arguments are
 * answered with statuses. */
#include <freetoken.h>
#include <freetoken_ep.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(ft_engine_params) == 16, "ft_engine_params layout");
_Static_assert(offsetof(ft_engine_params, pin_threads) == 12, "ft_engine_params layout");
_Static_assert(sizeof(ft_model_load_params) == 24, "ft_model_load_params layout");
_Static_assert(offsetof(ft_model_load_params, progress_user_data) == 16, "ft_model_load_params layout");
_Static_assert(sizeof(ft_model_desc) == 68, "ft_model_desc layout");
_Static_assert(offsetof(ft_model_desc, route_weight) == 60, "ft_model_desc layout (0.5)");
_Static_assert(offsetof(ft_model_desc, routing) == 40, "ft_model_desc layout");
_Static_assert(offsetof(ft_model_desc, renormalize) == 56, "ft_model_desc layout");
_Static_assert(sizeof(ft_session_params) == 72, "ft_session_params layout");
_Static_assert(offsetof(ft_session_params, cache_policy) == 64, "ft_session_params layout (0.5)");
_Static_assert(offsetof(ft_session_params, cache_half_life) == 68, "ft_session_params layout (0.5)");
_Static_assert(offsetof(ft_session_params, handoff_timeout_seconds) == 56, "ft_session_params layout (0.2)");
_Static_assert(offsetof(ft_session_params, cache_slots) == 16, "ft_session_params layout (0.2)");
_Static_assert(offsetof(ft_session_params, prefill_min_tokens) == 40, "ft_session_params layout (0.2)");
_Static_assert(offsetof(ft_session_params, shared_experts) == 12, "ft_session_params layout");
_Static_assert(offsetof(ft_session_params, check_finite) == 13, "ft_session_params layout");
_Static_assert(sizeof(ft_build_info) == 56, "ft_build_info layout");
_Static_assert(offsetof(ft_build_info, onednn_bf16) == 48, "ft_build_info layout (0.4)");
_Static_assert(offsetof(ft_build_info, cuda_archs) == 16, "ft_build_info layout");
_Static_assert(sizeof(ft_engine_info) == 32, "ft_engine_info layout");
_Static_assert(sizeof(ft_model_info) == 136, "ft_model_info layout");
_Static_assert(offsetof(ft_model_info, hash_layers) == 128, "ft_model_info layout (0.7)");
_Static_assert(offsetof(ft_model_info, vocab_size) == 132, "ft_model_info layout (0.7)");
_Static_assert(offsetof(ft_model_info, formats_used) == 120, "ft_model_info layout (0.6)");
_Static_assert(offsetof(ft_model_info, mixed_formats) == 124, "ft_model_info layout (0.6)");
_Static_assert(offsetof(ft_model_info, route_weight) == 104, "ft_model_info layout (0.5)");
_Static_assert(offsetof(ft_model_info, shared_expert_gate) == 116, "ft_model_info layout (0.5)");
_Static_assert(offsetof(ft_model_info, expert_bytes) == 72, "ft_model_info layout");
_Static_assert(offsetof(ft_model_info, architecture) == 88, "ft_model_info layout");
_Static_assert(sizeof(ft_tensor_view) == 64, "ft_tensor_view layout");
_Static_assert(sizeof(ft_session_stats) == 144, "ft_session_stats layout");
_Static_assert(offsetof(ft_session_stats, hybrid_gpu_seconds) == 128, "ft_session_stats layout (0.3)");
_Static_assert(offsetof(ft_session_stats, routes_gpu) == 64, "ft_session_stats layout (0.2)");
_Static_assert(sizeof(ft_layer_stats) == 48, "ft_layer_stats layout");
_Static_assert(sizeof(ft_ep_params) == 72, "ft_ep_params layout");
_Static_assert(offsetof(ft_ep_params, combine_wire) == 64, "ft_ep_params layout (combine wire)");
_Static_assert(sizeof(ft_ep_group_info) == 112, "ft_ep_group_info layout");
_Static_assert(offsetof(ft_ep_group_info, combine_wire) == 104, "ft_ep_group_info layout (combine wire)");
_Static_assert(offsetof(ft_ep_group_info, pci_bus_id) == 40, "ft_ep_group_info layout (topology)");
_Static_assert(sizeof(ft_ep_expert_batch) == 72, "ft_ep_expert_batch layout");
_Static_assert(offsetof(ft_session_stats, cpu_seconds) == 56, "ft_session_stats layout");
_Static_assert(sizeof(ft_profile_params) == 40, "ft_profile_params layout");
_Static_assert(offsetof(ft_profile_params, formats) == 12, "ft_profile_params layout");
_Static_assert(offsetof(ft_profile_params, max_seconds) == 16, "ft_profile_params layout");
_Static_assert(offsetof(ft_profile_params, progress) == 24, "ft_profile_params layout");
_Static_assert(offsetof(ft_profile_params, progress_user_data) == 32, "ft_profile_params layout");
_Static_assert(sizeof(ft_profile_machine) == 56, "ft_profile_machine layout");
_Static_assert(offsetof(ft_profile_machine, cpu_read_gbs) == 16, "ft_profile_machine layout");
_Static_assert(offsetof(ft_profile_machine, gpu_name) == 40, "ft_profile_machine layout");
_Static_assert(offsetof(ft_profile_machine, cpu_model) == 48, "ft_profile_machine layout");
_Static_assert(sizeof(ft_profile_format) == 64, "ft_profile_format layout");
_Static_assert(offsetof(ft_profile_format, expert_bytes) == 8, "ft_profile_format layout");
_Static_assert(offsetof(ft_profile_format, fetch_fraction) == 48, "ft_profile_format layout");
_Static_assert(offsetof(ft_profile_format, cpu_kernel) == 56, "ft_profile_format layout");
#endif

static int failures = 0, checks = 0;
#define EXPECT(cond)                                                            \
    do {                                                                        \
        ++checks;                                                               \
        if (!(cond)) {                                                          \
            ++failures;                                                         \
            fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                       \
    } while (0)

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int main(void) {
    char err[256];
    ft_engine *engine = NULL;
    ft_model *model = NULL;
    ft_session *session = NULL;

    EXPECT(ft_version_number() == FT_VERSION_NUMBER);
    EXPECT(strcmp(ft_status_string(FT_ERR_FORMAT), "FT_ERR_FORMAT") == 0);
    EXPECT(strcmp(ft_status_string(12345), "FT_ERR_UNKNOWN") == 0);

    /* struct_size 0 is refused, with a message, and no handle. */
    ft_engine_params ep;
    ft_engine_params_init(&ep);
    ep.struct_size = 0;
    engine = (ft_engine *)&ep;
    EXPECT(ft_engine_create(&ep, &engine, err, sizeof err) == FT_ERR_INVALID_ARGUMENT);
    EXPECT(engine == NULL);
    EXPECT(strstr(err, "struct_size") != NULL);

    /* An old caller that knows only struct_size and device gets defaults for the rest. */
    ft_engine_params_init(&ep);
    ep.struct_size = offsetof(ft_engine_params, cpu_threads);
    ep.device = FT_DEVICE_NONE;
    ep.cpu_threads = -77; /* beyond the old struct: must be ignored */
    EXPECT(ft_engine_create(&ep, &engine, err, sizeof err) == FT_OK);
    if (!engine) return 1;

    ft_engine_info ei;
    ei.struct_size = sizeof ei;
    EXPECT(ft_engine_get_info(engine, &ei) == FT_OK);
    EXPECT(ei.device == FT_DEVICE_NONE);
    EXPECT(ei.cpu_threads >= 1);

    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 1;
    d.num_experts = 4;
    d.top_k = 2;
    d.hidden_size = 64;
    d.intermediate_size = 32;
    EXPECT(ft_model_create(engine, &d, &model, err, sizeof err) == FT_OK);
    if (!model) return 1;
    uint16_t w[64 * 32];
    for (int i = 0; i < 64 * 32; ++i) w[i] = bf16(0.05f * (float)((i * 37) % 17 - 8));
    for (int e = 0; e < 4; ++e)
        for (int p = FT_PROJ_GATE; p <= FT_PROJ_DOWN; ++p) EXPECT(ft_model_set_expert(model, 0, e, p, w, sizeof w) == FT_OK);
    EXPECT(ft_model_finalize(model) == FT_OK);

    /* Old session caller: knows backend and max_tokens only; check_finite defaults to on. */
    ft_session_params sp;
    ft_session_params_init(&sp);
    sp.struct_size = offsetof(ft_session_params, shared_experts);
    sp.max_tokens = 2;
    sp.check_finite = false;
    EXPECT(ft_session_create(model, &sp, &session, err, sizeof err) == FT_OK);
    if (!session) return 1;
    EXPECT(ft_session_backend(session) == FT_BACKEND_CPU);

    uint16_t x[2 * 64], y[2 * 64];
    for (int i = 0; i < 2 * 64; ++i) x[i] = bf16(0.1f * (float)(i % 7) - 0.3f);
    int32_t ids[4] = {0, 3, 2, -1};
    float wts[4] = {0.6f, 0.4f, 1.0f, 0.0f};
    EXPECT(ft_decode(session, 0, 2, x, ids, wts, y) == FT_OK);
    x[5] = 0x7fc0; /* NaN */
    EXPECT(ft_decode(session, 0, 2, x, ids, wts, y) == FT_ERR_NON_FINITE);
    EXPECT(strlen(ft_session_last_error(session)) > 0);
    EXPECT(ft_decode(session, 0, 3, x, ids, wts, y) == FT_ERR_INVALID_ARGUMENT); /* > max_tokens */

    /* Output structs are written only up to struct_size. */
    struct {
        ft_session_stats stats;
        unsigned char canary[8];
    } box;
    memset(&box, 0xAB, sizeof box);
    box.stats.struct_size = offsetof(ft_session_stats, tokens);
    EXPECT(ft_session_get_stats(session, &box.stats) == FT_OK);
    EXPECT(box.stats.decode_calls == 1);
    EXPECT(box.stats.struct_size == offsetof(ft_session_stats, tokens));
    {
        const unsigned char *tail = (const unsigned char *)&box.stats + offsetof(ft_session_stats, tokens);
        int untouched = 1;
        for (size_t i = 0; i < sizeof box.stats - offsetof(ft_session_stats, tokens); ++i) untouched &= tail[i] == 0xAB;
        EXPECT(untouched);
    }

    /* NULL handles and frees. */
    EXPECT(ft_decode(NULL, 0, 1, x, ids, wts, y) == FT_ERR_INVALID_ARGUMENT);
    EXPECT(ft_route_tokens(NULL, 0, 1, NULL, NULL, ids, wts) == FT_ERR_INVALID_ARGUMENT);
    EXPECT(ft_model_get_info(NULL, NULL) == FT_ERR_INVALID_ARGUMENT);
    EXPECT(ft_model_layer_formats(NULL, 0, NULL, NULL) == FT_ERR_INVALID_ARGUMENT);
    EXPECT(ft_build_info_get(NULL) == FT_ERR_INVALID_ARGUMENT);
    ft_session_free(NULL);
    ft_model_free(NULL);
    ft_engine_free(NULL);

    /* EP params: the combine wire fields (appended in 0.3) default to bf16 and a 0.05 gate. */
    ft_ep_params epp;
    ft_ep_params_init(&epp);
    EXPECT(epp.struct_size == sizeof epp);
    EXPECT(epp.wire == FT_EP_WIRE_FP8);
    EXPECT(epp.combine_wire == FT_EP_WIRE_BF16);
    EXPECT(epp.combine_max_rel_error > 0.0499f && epp.combine_max_rel_error < 0.0501f);

    ft_build_info bi;
    bi.struct_size = sizeof bi;
    EXPECT(ft_build_info_get(&bi) == FT_OK);
    EXPECT(bi.version_number == FT_VERSION_NUMBER);
    EXPECT(bi.cpu_isa != NULL && strlen(bi.cpu_isa) > 0);
    EXPECT(bi.onednn_version != NULL && bi.onednn_version[0] >= '1' && bi.onednn_version[0] <= '9');
    {
        /* An old caller (0.3 layout, 48 bytes) gets no byte past its struct. */
        ft_build_info boxes[2];
        const unsigned char *raw = (const unsigned char *)boxes;
        memset(boxes, 0xA5, sizeof boxes);
        boxes[0].struct_size = 48;
        EXPECT(ft_build_info_get(&boxes[0]) == FT_OK);
        EXPECT(boxes[0].version_number == FT_VERSION_NUMBER);
        EXPECT(raw[48] == 0xA5 && raw[sizeof boxes - 1] == 0xA5);
    }

    ft_session_free(session);
    ft_model_free(model);
    ft_engine_free(engine);
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
