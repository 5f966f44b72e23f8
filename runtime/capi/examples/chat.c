/*
 * spc_chat: a conversation through the C API, as `speccompile chat` holds one.
 *
 *   spc_chat MODEL_DIR --model-lib LIB [--system TEXT] [--max-tokens N] [--temperature T]
 *            [--seed S] [--speculative-mode disable|ngram|suffix|small_draft|eagle|medusa] [--additional-models DIR,LIB]
 *            [--device D] [--no-prefix-cache]
 *
 * Reads one user message per line on stdin and streams each answer to stdout. The whole
 * conversation is sent every turn (spc_generate_chat renders it with the model's chat
 * format); the session's prefix cache keeps the previous turn's KV, so each turn prefills
 * only its new message. After each answer a line of stats goes to stderr:
 *   [turn 2: 41 prompt tokens prefilled, 57 cached; first token 0.081 s; 23.4 tok/s]
 */
#include <speccompile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int on_text(const char* delta, size_t n, void* user) {
  (void)user;
  fwrite(delta, 1, n, stdout);
  fflush(stdout);
  return 0;
}

static char* copy(const char* s, size_t n) {
  char* out = (char*)malloc(n + 1);
  if (out) {
    memcpy(out, s, n);
    out[n] = '\0';
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    fprintf(stderr, "usage: %s MODEL_DIR --model-lib LIB [--system TEXT] [--max-tokens N] [--temperature T] "
                    "[--seed S] [--speculative-mode disable|ngram|suffix|small_draft|eagle|medusa] [--additional-models DIR,LIB] [--device D] "
                    "[--no-prefix-cache]\n", argv[0]);
    return 2;
  }
  const char *lib = NULL, *system_prompt = NULL, *device = "auto";
  char* additional = NULL; /* DRAFT_DIR,DRAFT_LIB */
  spc_session_config cfg;
  spc_generate_params params;
  spc_session_config_default(&cfg);
  spc_generate_params_default(&params);
  params.max_tokens = 512;
  for (int i = 2; i < argc; ++i) {
    const char* a = argv[i];
    int has_value = i + 1 < argc;
    if (!strcmp(a, "--no-prefix-cache")) cfg.prefix_cache_max_num_recycling_seqs = 0;
    else if (!has_value) { fprintf(stderr, "spc_chat: %s needs a value\n", a); return 2; }
    else if (!strcmp(a, "--model-lib")) lib = argv[++i];
    else if (!strcmp(a, "--system")) system_prompt = argv[++i];
    else if (!strcmp(a, "--max-tokens")) params.max_tokens = atoi(argv[++i]);
    else if (!strcmp(a, "--temperature")) params.temperature = (float)atof(argv[++i]);
    else if (!strcmp(a, "--seed")) params.seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(a, "--device")) device = argv[++i];
    else if (!strcmp(a, "--additional-models")) additional = argv[++i];
    else if (!strcmp(a, "--speculative-mode")) {
      const char* m = argv[++i];
      if (!strcmp(m, "disable")) cfg.speculative_mode = SPC_SPEC_DISABLE;
      else if (!strcmp(m, "ngram")) cfg.speculative_mode = SPC_SPEC_NGRAM;
      else if (!strcmp(m, "suffix")) cfg.speculative_mode = SPC_SPEC_SUFFIX;
      else if (!strcmp(m, "small_draft")) cfg.speculative_mode = SPC_SPEC_SMALL_DRAFT;
      else if (!strcmp(m, "eagle")) cfg.speculative_mode = SPC_SPEC_EAGLE;
      else if (!strcmp(m, "medusa")) cfg.speculative_mode = SPC_SPEC_MEDUSA;
      else { fprintf(stderr, "spc_chat: --speculative-mode is one of disable, ngram, suffix, small_draft, eagle, medusa\n"); return 2; }
    } else { fprintf(stderr, "spc_chat: unknown option %s\n", a); return 2; }
  }
  if (!lib) { fprintf(stderr, "spc_chat: --model-lib is required\n"); return 2; }
  char* draft_lib = additional ? strchr(additional, ',') : NULL;
  if (additional && !draft_lib) {
    fprintf(stderr, "spc_chat: --additional-models takes DIR,LIB (a draft model, an EAGLE head or Medusa heads)\n");
    return 2;
  }
  if (draft_lib) *draft_lib++ = '\0';

  spc_model* model = NULL;
  spc_model* draft = NULL;
  spc_session* session = NULL;
  if (spc_model_load(argv[1], lib, device, &model) != SPC_OK ||
      (draft_lib && spc_model_load(additional, draft_lib, device, &draft) != SPC_OK)) {
    fprintf(stderr, "spc_chat: %s\n", spc_last_error());
    return 1;
  }
  cfg.draft_model = draft;
  if (spc_session_create(model, &cfg, &session) != SPC_OK) {
    fprintf(stderr, "spc_chat: %s\n", spc_last_error());
    return 1;
  }
  size_t n = 0, cap = 16;
  spc_chat_message* messages = (spc_chat_message*)malloc(cap * sizeof(spc_chat_message));
  if (system_prompt) messages[n++] = (spc_chat_message){"system", copy(system_prompt, strlen(system_prompt))};
  char line[16384];
  int rc = 0;
  for (int turn = 1; fgets(line, sizeof line, stdin); ++turn) {
    size_t len = strcspn(line, "\r\n");
    if (len == 0) { --turn; continue; }
    if (n + 2 > cap) messages = (spc_chat_message*)realloc(messages, (cap *= 2) * sizeof(spc_chat_message));
    messages[n++] = (spc_chat_message){"user", copy(line, len)};
    if (spc_generate_chat(session, messages, n, &params, on_text, NULL, NULL, 0, NULL) != SPC_OK) {
      fprintf(stderr, "\nspc_chat: %s\n", spc_last_error());
      rc = 1;
      break;
    }
    const char* answer;
    size_t answer_len;
    spc_session_last_text(session, &answer, &answer_len);
    messages[n++] = (spc_chat_message){"assistant", copy(answer, answer_len)};
    spc_stats s;
    spc_session_stats(session, &s);
    printf("\n");
    fprintf(stderr, "[turn %d: %lld prompt tokens prefilled, %lld cached; first token %.3f s; %.1f tok/s]\n", turn,
            (long long)s.prefill_tokens, (long long)s.cached_prompt_tokens, s.prefill_seconds, s.decode_tokens_per_s);
  }
  for (size_t i = 0; i < n; ++i) free((void*)messages[i].content);
  free(messages);
  spc_session_free(session);
  spc_model_free(draft);
  spc_model_free(model);
  return rc;
}
