/*
 * spc_generate: generate from prompt token ids with the speccompile C API.
 *
 *   spc_generate MODEL_DIR LIB PROMPT_IDS MAX_TOKENS [--ngram] [--draft-length K]
 *                [--ngram-min N] [--ngram-max N] [--temperature T] [--top-p P]
 *                [--top-k K] [--seed S] [--device D] [--stream]
 *
 * PROMPT_IDS is comma separated ("1,9690,198"); tokenize with your tokenizer (the
 * speccompile Python tokenizer renders the chat template). Prints one JSON object:
 * token_ids, text (via MODEL_DIR/tokenizer.json when it is byte-level BPE, else null),
 * finish_reason and stats. --stream writes the text to stderr as it is generated.
 * --device defaults to "auto": the device kind the library was built for.
 */
#include <speccompile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const spc_detokenizer* detok;
  int32_t* ids; /* everything streamed so far, to decode multi-token characters */
  size_t n, cap;
  size_t printed; /* bytes of the decoded text already written */
} stream_state;

static int on_tokens(const int32_t* tokens, size_t n, void* user) {
  stream_state* st = (stream_state*)user;
  if (st->n + n > st->cap) {
    st->cap = (st->n + n) * 2;
    st->ids = (int32_t*)realloc(st->ids, st->cap * sizeof(int32_t));
    if (!st->ids) return 1; /* out of memory: stop generating */
  }
  memcpy(st->ids + st->n, tokens, n * sizeof(int32_t));
  st->n += n;
  size_t len = 0;
  if (spc_detokenize(st->detok, st->ids, st->n, 1, NULL, 0, &len) != SPC_OK) return 0;
  char* text = (char*)malloc(len + 1);
  if (text && spc_detokenize(st->detok, st->ids, st->n, 1, text, len + 1, &len) == SPC_OK && len > st->printed) {
    fwrite(text + st->printed, 1, len - st->printed, stderr);
    fflush(stderr);
    st->printed = len;
  }
  free(text);
  return 0;
}

static void print_json_string(const char* s, size_t n) {
  putchar('"');
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c == '\n') printf("\\n");
    else if (c == '\r') printf("\\r");
    else if (c == '\t') printf("\\t");
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static int die(const char* what) {
  fprintf(stderr, "spc_generate: %s: %s\n", what, spc_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s MODEL_DIR LIB PROMPT_IDS MAX_TOKENS [--ngram] [--draft-length K] [--ngram-min N] "
                    "[--ngram-max N] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--device D] [--stream]\n",
            argv[0]);
    return 2;
  }
  const char* model_dir = argv[1];
  const char* lib = argv[2];
  const char* device = "auto";
  int stream = 0;
  spc_session_config cfg;
  spc_generate_params params;
  spc_session_config_default(&cfg);
  spc_generate_params_default(&params);
  params.max_tokens = atoi(argv[4]);
  for (int i = 5; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--ngram")) cfg.speculative_mode = SPC_SPEC_NGRAM;
    else if (!strcmp(a, "--stream")) stream = 1;
    else if (v && !strcmp(a, "--draft-length")) cfg.draft_length = atoi(argv[++i]);
    else if (v && !strcmp(a, "--ngram-min")) cfg.ngram_min = atoi(argv[++i]);
    else if (v && !strcmp(a, "--ngram-max")) cfg.ngram_max = atoi(argv[++i]);
    else if (v && !strcmp(a, "--temperature")) params.temperature = (float)atof(argv[++i]);
    else if (v && !strcmp(a, "--top-p")) params.top_p = (float)atof(argv[++i]);
    else if (v && !strcmp(a, "--top-k")) params.top_k = atoi(argv[++i]);
    else if (v && !strcmp(a, "--seed")) params.seed = strtoull(argv[++i], NULL, 10);
    else if (v && !strcmp(a, "--device")) device = argv[++i];
    else {
      fprintf(stderr, "spc_generate: unknown or incomplete option %s\n", a);
      return 2;
    }
  }
  /* prompt ids */
  size_t n_prompt = 0, cap = 16;
  int32_t* prompt = (int32_t*)malloc(cap * sizeof(int32_t));
  for (const char* p = argv[3]; *p;) {
    char* end;
    long id = strtol(p, &end, 10);
    if (end == p || (*end && *end != ',')) {
      fprintf(stderr, "spc_generate: PROMPT_IDS must be comma-separated integers\n");
      return 2;
    }
    if (n_prompt == cap) prompt = (int32_t*)realloc(prompt, (cap *= 2) * sizeof(int32_t));
    prompt[n_prompt++] = (int32_t)id;
    p = *end ? end + 1 : end;
  }

  spc_model* model = NULL;
  spc_session* session = NULL;
  spc_detokenizer* detok = NULL;
  if (spc_model_load(model_dir, lib, device, &model) != SPC_OK) return die("loading the model");
  if (spc_session_create(model, &cfg, &session) != SPC_OK) return die("creating the session");
  char tok_path[4096];
  snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", model_dir);
  if (spc_detokenizer_load(tok_path, &detok) != SPC_OK) {
    fprintf(stderr, "spc_generate: no text output: %s\n", spc_last_error());
    detok = NULL;
  }
  stream_state st = {detok, NULL, 0, 0, 0};
  size_t cap_out = params.max_tokens > 0 ? (size_t)params.max_tokens : 1, n_out = 0;
  int32_t* out = (int32_t*)malloc(cap_out * sizeof(int32_t));
  if (spc_generate(session, prompt, n_prompt, &params, stream && detok ? on_tokens : NULL, &st, out, cap_out, &n_out) !=
      SPC_OK) {
    return die("generating");
  }
  if (stream && detok) fputc('\n', stderr);
  spc_stats s;
  spc_session_stats(session, &s);

  static const char* reasons[] = {"none", "stop", "length", "cancelled"};
  printf("{\"token_ids\": [");
  for (size_t i = 0; i < n_out; ++i) printf(i ? ", %d" : "%d", out[i]);
  printf("], \"text\": ");
  size_t len = 0;
  if (detok && spc_detokenize(detok, out, n_out, 1, NULL, 0, &len) == SPC_OK) {
    char* text = (char*)malloc(len + 1);
    spc_detokenize(detok, out, n_out, 1, text, len + 1, &len);
    print_json_string(text, len);
    free(text);
  } else {
    printf("null");
  }
  printf(", \"finish_reason\": \"%s\", \"stats\": {\"prefill_tokens\": %lld, \"decode_tokens\": %lld, "
         "\"draft_tokens\": %lld, \"accepted_tokens\": %lld, \"verify_steps\": %lld, \"plain_steps\": %lld, "
         "\"accept_rate\": %.4f, \"mean_accepted_length\": %.4f, \"prefill_tokens_per_s\": %.2f, "
         "\"decode_tokens_per_s\": %.2f}}\n",
         reasons[s.finish_reason], (long long)s.prefill_tokens, (long long)s.decode_tokens, (long long)s.draft_tokens,
         (long long)s.accepted_tokens, (long long)s.verify_steps, (long long)s.plain_steps, s.accept_rate,
         s.mean_accepted_length, s.prefill_tokens_per_s, s.decode_tokens_per_s);

  free(out);
  free(prompt);
  free(st.ids);
  spc_detokenizer_free(detok);
  spc_session_free(session);
  spc_model_free(model);
  return 0;
}
