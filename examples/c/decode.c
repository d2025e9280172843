/* A C consumer of libfreetoken: builds a small MoE layer from memory (or loads a checkpoint
 * directory given as the first argument), routes random router logits and decodes a batch.
 * Build against an installed library:
 *   cc -std=c99 decode.c $(pkg-config --cflags --libs freetoken) -o decode
 */
#include <freetoken.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rng_state = 12345u;
static float uniform(void) { /* xorshift32 in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

static uint16_t to_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define CHECK(call, handle_err)                                                          \
    do {                                                                                 \
        ft_status s_ = (call);                                                           \
        if (s_ != FT_OK) {                                                               \
            fprintf(stderr, "%s: %s: %s\n", #call, ft_status_string(s_), (handle_err)); \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

static int build_model(ft_engine *engine, ft_model **model) {
    char err[256];
    ft_model_desc d;
    ft_model_desc_init(&d);
    d.num_layers = 2;
    d.num_experts = 16;
    d.top_k = 4;
    d.hidden_size = 256;
    d.intermediate_size = 128;
    CHECK(ft_model_create(engine, &d, model, err, sizeof err), err);
    size_t n = (size_t)d.hidden_size * d.intermediate_size;
    uint16_t *w = malloc(n * sizeof *w);
    if (!w) return 1;
    for (int l = 0; l < d.num_layers; ++l)
        for (int e = 0; e < d.num_experts; ++e)
            for (int p = FT_PROJ_GATE; p <= FT_PROJ_DOWN; ++p) {
                for (size_t i = 0; i < n; ++i) w[i] = to_bf16(0.08f * uniform());
                CHECK(ft_model_set_expert(*model, l, e, p, w, n * sizeof *w), ft_model_last_error(*model));
            }
    free(w);
    CHECK(ft_model_finalize(*model), ft_model_last_error(*model));
    return 0;
}

int main(int argc, char **argv) {
    char err[256];
    ft_engine *engine = NULL;
    ft_model *model = NULL;
    ft_session *session = NULL;
    printf("libfreetoken %s\n", ft_version_string());

    CHECK(ft_engine_create(NULL, &engine, err, sizeof err), err);
    if (argc > 1) {
        CHECK(ft_model_load(engine, argv[1], NULL, &model, err, sizeof err), err);
    } else if (build_model(engine, &model) != 0) {
        return 1;
    }
    ft_model_info info;
    info.struct_size = sizeof info;
    CHECK(ft_model_get_info(model, &info), "");
    CHECK(ft_session_create(model, NULL, &session, err, sizeof err), err);

    const int T = 4, E = info.num_experts, K = info.top_k, H = info.hidden_size;
    float *logits = malloc(sizeof(float) * T * E), *weights = malloc(sizeof(float) * T * K);
    int32_t *ids = malloc(sizeof(int32_t) * T * K);
    uint16_t *x = malloc(sizeof(uint16_t) * T * H), *y = malloc(sizeof(uint16_t) * T * H);
    if (!logits || !weights || !ids || !x || !y) return 1;
    for (int i = 0; i < T * E; ++i) logits[i] = 2.0f * uniform();
    for (int i = 0; i < T * H; ++i) x[i] = to_bf16(uniform());

    for (int layer = 0; layer < info.num_layers; ++layer) {
        CHECK(ft_route(session, layer, T, logits, ids, weights), ft_session_last_error(session));
        CHECK(ft_decode(session, layer, T, x, ids, weights, y), ft_session_last_error(session));
        double norm = 0.0;
        for (int i = 0; i < T * H; ++i) {
            float v = from_bf16(y[i]);
            if (!isfinite(v)) {
                fprintf(stderr, "non-finite output\n");
                return 1;
            }
            norm += (double)v * v;
        }
        printf("layer %d: token 0 -> experts", layer);
        for (int k = 0; k < K; ++k) printf(" %d(%.3f)", ids[k], weights[k]);
        printf(", |out| = %.4f\n", sqrt(norm));
        if (norm == 0.0) {
            fprintf(stderr, "output is all zeros\n");
            return 1;
        }
    }
    ft_session_stats st;
    st.struct_size = sizeof st;
    CHECK(ft_session_get_stats(session, &st), "");
    printf("%llu routes, %llu distinct expert reads, %.1f MB read\n", (unsigned long long)st.routes_cpu,
           (unsigned long long)st.experts_cpu, st.cpu_bytes / 1e6);

    free(logits), free(weights), free(ids), free(x), free(y);
    ft_session_free(session);
    ft_model_free(model);
    ft_engine_free(engine);
    return 0;
}
