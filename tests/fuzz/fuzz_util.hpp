// Shared helpers of the libFuzzer targets: a scratch folder per process (in /dev/shm when there
// is one), files written from the fuzz input, one CPU engine for the whole run, and one decode
// step through a loaded model so that hostile weights reach the kernels.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "freetoken.h"

namespace ftfuzz {

// Parts of one input are separated by this marker (the dictionaries list it): a safetensors
// checkpoint is config.json, index.json, then the shards.
inline const std::string kSeparator = "\n@@FT-PART@@\n";

inline std::vector<std::string> split_parts(const uint8_t *data, size_t size) {
    std::vector<std::string> parts;
    const std::string in(reinterpret_cast<const char *>(data), size);
    size_t start = 0;
    for (;;) {
        const size_t at = in.find(kSeparator, start);
        if (at == std::string::npos) {
            parts.push_back(in.substr(start));
            return parts;
        }
        parts.push_back(in.substr(start, at - start));
        start = at + kSeparator.size();
    }
}

inline std::string join_parts(const std::vector<std::string> &parts) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? kSeparator : std::string()) + parts[i];
    return out;
}

// An empty scratch folder of this process, created once.
inline const std::string &scratch_dir() {
    static const std::string dir = [] {
        struct stat st;
        const char *base = ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
        std::string d = std::string(base) + "/ft-fuzz-" + std::to_string(::getpid());
        ::mkdir(d.c_str(), 0700);
        return d;
    }();
    return dir;
}

// The scratch subfolder `sub`, created if missing and emptied of the files a previous input left.
inline std::string fresh_dir(const std::string &sub) {
    const std::string d = scratch_dir() + "/" + sub;
    ::mkdir(d.c_str(), 0700);
    if (DIR *dir = ::opendir(d.c_str())) {
        while (const dirent *e = ::readdir(dir))
            if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
                ::unlink((d + "/" + e->d_name).c_str());
        ::closedir(dir);
    }
    return d;
}

inline void write_file(const std::string &path, const std::string &bytes) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
}

// One CPU engine (one worker, unpinned) for the process; the library's log is silenced.
inline ft_engine *engine() {
    static ft_engine *e = [] {
        ft_log_set_callback(nullptr, nullptr, FT_LOG_OFF);
        ft_engine_params p;
        ft_engine_params_init(&p);
        p.device = FT_DEVICE_NONE;
        p.cpu_threads = 1;
        p.pin_threads = false;
        ft_engine *out = nullptr;
        char err[256];
        if (ft_engine_create(&p, &out, err, sizeof err) != FT_OK) {
            std::fprintf(stderr, "fuzz: engine: %s\n", err);
            std::abort();
        }
        return out;
    }();
    return e;
}

// A status must be one of the library's; a message must be a terminated string.
inline void check_status(ft_status s, const char *err) {
    if (!ft_status_string(s)) std::abort();
    if (s != FT_OK && std::strlen(err) == 0) std::abort();
}

// Routes one token through MoE layer 0 and decodes it on a CPU session with check_finite off,
// so NaN/Inf weights run through the kernels (their outputs are unspecified, never UB).
inline void decode_once(ft_model *m) {
    ft_model_info info;
    info.struct_size = sizeof info;
    if (ft_model_get_info(m, &info) != FT_OK) std::abort();
    if (info.hidden_size > 4096 || info.num_experts > 512 || info.intermediate_size > 4096) return;
    ft_session_params sp;
    ft_session_params_init(&sp);
    sp.backend = FT_BACKEND_CPU;
    sp.max_tokens = 1;
    sp.check_finite = false;
    ft_session *s = nullptr;
    char err[256] = "";
    const ft_status st = ft_session_create(m, &sp, &s, err, sizeof err);
    check_status(st, err);
    if (st != FT_OK) return;
    const int E = info.num_experts, K = info.top_k, H = info.hidden_size;
    std::vector<float> logits(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) logits[e] = static_cast<float>((e * 7) % 5) - 2.0f;
    std::vector<int32_t> ids(static_cast<size_t>(K));
    std::vector<float> w(static_cast<size_t>(K));
    if (ft_route(s, 0, 1, logits.data(), ids.data(), w.data()) == FT_OK) {
        std::vector<uint16_t> hidden(static_cast<size_t>(H), 0x3f80), out(static_cast<size_t>(H));
        const ft_status d = ft_decode(s, 0, 1, hidden.data(), ids.data(), w.data(), out.data());
        if (!ft_status_string(d)) std::abort();
    }
    ft_session_free(s);
}

}  // namespace ftfuzz
