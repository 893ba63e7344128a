// The aarch64 check of the patched llama.cpp (scripts/install-aarch64.sh builds it,
// statically linked; tests/e2e/test_aarch64.py runs it under qemu-aarch64 and judges).
//
// usage: check MODEL CHAT_PROMPT N_GREEDY [fast]
//
// With the invariant kernels (GGML_CPU_USE_REF: what the engine's deterministic mode
// selects, engine/runtime/llama_backend.py), or the default kernels with "fast"; the
// weights loaded as the engine loads them in both modes (llama.cpp's defaults: repacked
// where ggml repacks that type for this CPU, whose rows use_ref computes as lone rows):
// - greedy: CHAT_PROMPT (rendered with the model's template) prefilled in one batch,
//   then up to N_GREEDY tokens of its greedy answer, on 1 thread;
// - rows: the prompt's last row recomputed alone on 1 thread (the reference), compared
//   bitwise with the prefill batch's, alone on 2 threads, and first of a 7- and of a
//   12-row batch with logits for every row (a token and its draft) on 2 threads,
//   as test_llama_backend.py's decode-row test does on x86. Emulation is slow: the rows
//   reuse the prompt's cells (a 300-cell depth took 9.5 minutes under qemu here).
// Prints one JSON object a line; the test decides what must hold.
#include "llama.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Run {
    llama_context * ctx;
    const llama_vocab * vocab;
    int n_vocab;
};

[[noreturn]] void die(const std::string & what) {
    std::fprintf(stderr, "check: %s\n", what.c_str());
    std::exit(2);
}

std::string json_string(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool special) {
    std::vector<llama_token> tokens(text.size() + 8);
    int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                           static_cast<int32_t>(tokens.size()), /*add_special=*/true, special);
    if (n < 0) {
        die("tokenize failed");
    }
    tokens.resize(n);
    return tokens;
}

// Decodes tokens[0..n) at positions from `pos`, logits for the rows in `out_rows`
// (indices into the batch); returns them, one vector a row.
std::vector<std::vector<float>> decode(Run & run, const llama_token * tokens, int n, int pos,
                                       const std::vector<int> & out_rows) {
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = pos + i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 0;
    }
    for (int row : out_rows) {
        batch.logits[row] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(run.ctx, batch) != 0) {
        die("llama_decode failed");
    }
    llama_batch_free(batch);
    std::vector<std::vector<float>> rows;
    for (int row : out_rows) {
        const float * logits = llama_get_logits_ith(run.ctx, row);
        rows.emplace_back(logits, logits + run.n_vocab);
    }
    return rows;
}

void truncate(Run & run, int pos) {
    if (!llama_memory_seq_rm(llama_get_memory(run.ctx), 0, pos, -1)) {
        die("llama_memory_seq_rm failed");
    }
}

int argmax(const std::vector<float> & logits) {
    int best = 0;
    for (int t = 1; t < static_cast<int>(logits.size()); t++) {
        if (logits[t] > logits[best]) {
            best = t;
        }
    }
    return best;
}

void report(const char * shape, const std::vector<float> & row, const std::vector<float> & ref) {
    float worst = 0.0f;
    for (size_t i = 0; i < ref.size(); i++) {
        worst = std::fmax(worst, std::fabs(row[i] - ref[i]));
    }
    bool same = std::memcmp(row.data(), ref.data(), ref.size() * sizeof(float)) == 0;
    std::printf("{\"shape\": %s, \"max_abs_diff\": %g, \"bitwise_equal\": %s}\n",
                json_string(shape).c_str(), worst, same ? "true" : "false");
}

double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The prompt's prefill and greedy answer on 1 thread; returns the prompt's tokens and
// the answer's, and the prompt's last row as the prefill batch computed it.
void greedy(Run & run, const std::string & prompt, int n_tokens, std::vector<llama_token> & tokens,
            std::vector<llama_token> & answer, std::vector<float> & in_prefill) {
    auto t0 = std::chrono::steady_clock::now();
    llama_set_n_threads(run.ctx, 1, 1);  // a busy machine holds 2 threads at the barriers
    tokens = tokenize(run.vocab, prompt, /*special=*/true);
    const int n = static_cast<int>(tokens.size());
    in_prefill = decode(run, tokens.data(), n, 0, {n - 1})[0];
    std::string text;
    llama_token next = argmax(in_prefill);
    for (int pos = n; static_cast<int>(answer.size()) < n_tokens; pos++) {
        if (llama_vocab_is_eog(run.vocab, next)) {
            break;
        }
        answer.push_back(next);
        char piece[256];
        int len = llama_token_to_piece(run.vocab, next, piece, sizeof piece, 0, false);
        if (len < 0) {
            die("token_to_piece failed");
        }
        text.append(piece, len);
        next = argmax(decode(run, &next, 1, pos, {0})[0]);
    }
    std::printf("{\"greedy\": %s, \"prompt_tokens\": %d, \"seconds\": %.1f}\n",
                json_string(text).c_str(), n, since(t0));
}

// The prompt's last row (at depth n - 1) recomputed alone on 1 thread, the reference,
// and compared with the prefill batch's, alone on 2 threads, and first of a 7- and a
// 12-row batch (the row, then the answer's tokens as a draft) on 2 threads.
void rows(Run & run, const std::vector<llama_token> & tokens,
          const std::vector<llama_token> & answer, const std::vector<float> & in_prefill) {
    auto t0 = std::chrono::steady_clock::now();
    const int depth = static_cast<int>(tokens.size()) - 1;
    std::vector<llama_token> batch = {tokens[depth]};
    for (size_t i = 0; batch.size() < 12; i++) {
        batch.push_back(answer.empty() ? tokens[i] : answer[i % answer.size()]);
    }
    auto row = [&](int n_rows, int threads) {
        truncate(run, depth);
        llama_set_n_threads(run.ctx, threads, threads);
        std::vector<int> all(n_rows);  // a draft's rows all have logits, as the engine's
        for (int i = 0; i < n_rows; i++) {
            all[i] = i;
        }
        return decode(run, batch.data(), n_rows, depth, all)[0];
    };
    std::vector<float> alone = row(1, 1);
    report("last of the prefill batch", in_prefill, alone);
    report("alone, two threads", row(1, 2), alone);
    report("first of 7 rows, two threads", row(7, 2), alone);
    report("first of 12 rows, two threads", row(12, 2), alone);
    std::printf("{\"depth\": %d, \"seconds\": %.1f}\n", depth, since(t0));
}

void quiet(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || std::getenv("EDGE_LLM_CHECK_LOG") != nullptr) {
        std::fputs(text, stderr);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 4) {
        die("usage: check MODEL CHAT_PROMPT N_GREEDY [fast]");
    }
    const bool fast = argc > 4 && std::strcmp(argv[4], "fast") == 0;
    if (fast) {
        unsetenv("GGML_CPU_USE_REF");
    } else {
        setenv("GGML_CPU_USE_REF", "1", 1);  // read when the context's CPU backend is made
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();  // as the engine's _load_model
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (!model) {
        die(std::string("cannot load ") + argv[1]);
    }
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 256;
    cparams.n_batch = cparams.n_ubatch = 512;
    cparams.n_seq_max = 1;
    cparams.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        die("cannot create a context");
    }
    Run run{ctx, llama_model_get_vocab(model), 0};
    run.n_vocab = llama_vocab_n_tokens(run.vocab);

    std::printf("{\"kernels\": \"%s\"}\n", fast ? "fast" : "invariant");
    std::vector<llama_token> tokens, answer;
    std::vector<float> in_prefill;
    greedy(run, argv[2], std::atoi(argv[3]), tokens, answer, in_prefill);
    rows(run, tokens, answer, in_prefill);
    std::fflush(stdout);

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
