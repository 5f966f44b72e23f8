/*
 * spc_generate: `speccompile generate` through the C API, with its flags and its JSON.
 *
 *   spc_generate MODEL_DIR --model-lib LIB --prompt TEXT [--raw] [--max-tokens N]
 *                [--temperature T] [--top-p P] [--top-k K] [--seed S] [--stop TEXT]...
 *                [--min-p P] [--frequency-penalty F] [--presence-penalty F] [--repetition-penalty R]
 *                [--logit-bias ID:BIAS,ID:BIAS,...]
 *                [--speculative-mode disable|ngram|suffix|small_draft|eagle|medusa]
 *                [--additional-models DIR,LIB] [--spec-draft-length K]
 *                [--spec-tree-width W] [--spec-tree-nodes N]
 *                [--ngram-min N] [--ngram-max N] [--max-total-tokens N] [--device D]
 *                [--ignore-eos] [--stream] [--json]
 *   spc_generate MODEL_DIR --model-lib LIB --prompt-ids 1,9690,198 ...   (token ids in)
 *
 * The prompt is one user message rendered with the model's chat format (as `speccompile
 * generate` renders it with the chat template); --raw tokenizes it as it is. --json prints
 * one JSON object: prompt_token_ids, token_ids, text, finish_reason and stats; otherwise the
 * text is printed as it is generated (beside --json, --stream prints it to stderr).
 * --device defaults to "auto": the device kind the library was built for. --speculative-mode
 * defaults to suffix, as `speccompile generate`'s does (at a fixed draft length: 4, or
 * --spec-draft-length; the C runtime has no adaptive one yet). --additional-models DIR,LIB
 * names the draft model (small_draft), the EAGLE head (eagle) or the Medusa heads (medusa), as
 * `speccompile generate` takes them; with the default mode it names the drafter merged with
 * the suffix index every step.
 */
#include <speccompile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP 16
#define MAX_BIAS 256

/* The text as it is generated: to stdout, or to stderr beside --json (user: the FILE*). */
static int on_text(const char* delta, size_t n, void* user) {
  fwrite(delta, 1, n, (FILE*)user);
  fflush((FILE*)user);
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
    else if (c < 0x20 || c == 0x7f) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static void print_ids(const char* key, const int32_t* ids, size_t n) {
  printf("\"%s\": [", key);
  for (size_t i = 0; i < n; ++i) printf(i ? ", %d" : "%d", ids[i]);
  printf("]");
}

static int die(const char* what) {
  fprintf(stderr, "spc_generate: %s: %s\n", what, spc_last_error());
  return 1;
}

static int usage(const char* argv0, const char* why) {
  if (why) fprintf(stderr, "spc_generate: %s\n", why);
  fprintf(stderr,
          "usage: %s MODEL_DIR --model-lib LIB (--prompt TEXT [--raw] | --prompt-ids I,J,...) [--max-tokens N] "
          "[--temperature T] [--top-p P] [--top-k K] [--seed S] [--stop TEXT]... "
          "[--min-p P] [--frequency-penalty F] [--presence-penalty F] [--repetition-penalty R] "
          "[--logit-bias ID:BIAS,...] "
          "[--speculative-mode disable|ngram|suffix|small_draft|eagle|medusa] [--additional-models DIR,LIB] "
          "[--spec-draft-length K] [--spec-tree-width W] [--spec-tree-nodes N] [--ngram-min N] [--ngram-max N] "
          "[--max-total-tokens N] [--device D] "
          "[--ignore-eos] [--stream] [--json]\n",
          argv0);
  return 2;
}

/* "1,9690,198" -> ids; NULL on malformed input. */
static int32_t* parse_ids(const char* text, size_t* n) {
  size_t cap = 16;
  int32_t* ids = (int32_t*)malloc(cap * sizeof(int32_t));
  *n = 0;
  for (const char* p = text; ids && *p;) {
    char* end;
    long id = strtol(p, &end, 10);
    if (end == p || (*end && *end != ',')) {
      free(ids);
      return NULL;
    }
    if (*n == cap) ids = (int32_t*)realloc(ids, (cap *= 2) * sizeof(int32_t));
    if (ids) ids[(*n)++] = (int32_t)id;
    p = *end ? end + 1 : end;
  }
  return ids;
}

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return usage(argv[0], NULL);
  const char *model_dir = argv[1], *lib = NULL, *prompt = NULL, *prompt_ids = NULL, *device = "auto";
  char* additional = NULL; /* DRAFT_DIR,DRAFT_LIB */
  const char* stop[MAX_STOP];
  int32_t bias_ids[MAX_BIAS];
  float biases[MAX_BIAS];
  int raw = 0, stream = 0, as_json = 0;
  spc_session_config cfg;
  spc_generate_params params;
  spc_session_config_default(&cfg);
  spc_generate_params_default(&params);
  for (int i = 2; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--raw")) raw = 1;
    else if (!strcmp(a, "--stream")) stream = 1;
    else if (!strcmp(a, "--json")) as_json = 1;
    else if (!strcmp(a, "--ignore-eos")) params.ignore_eos = 1;
    else if (!v) return usage(argv[0], "an option is missing its value");
    else if (!strcmp(a, "--model-lib")) lib = argv[++i];
    else if (!strcmp(a, "--prompt")) prompt = argv[++i];
    else if (!strcmp(a, "--prompt-ids")) prompt_ids = argv[++i];
    else if (!strcmp(a, "--additional-models")) additional = argv[++i];
    else if (!strcmp(a, "--max-tokens")) params.max_tokens = atoi(argv[++i]);
    else if (!strcmp(a, "--temperature")) params.temperature = (float)atof(argv[++i]);
    else if (!strcmp(a, "--top-p")) params.top_p = (float)atof(argv[++i]);
    else if (!strcmp(a, "--top-k")) params.top_k = atoi(argv[++i]);
    else if (!strcmp(a, "--seed")) params.seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(a, "--min-p")) params.min_p = (float)atof(argv[++i]);
    else if (!strcmp(a, "--frequency-penalty")) params.frequency_penalty = (float)atof(argv[++i]);
    else if (!strcmp(a, "--presence-penalty")) params.presence_penalty = (float)atof(argv[++i]);
    else if (!strcmp(a, "--repetition-penalty")) params.repetition_penalty = (float)atof(argv[++i]);
    else if (!strcmp(a, "--logit-bias")) {
      /* ID:BIAS,ID:BIAS,... (as speccompile generate's --logit-bias) */
      const char* at = argv[++i];
      params.n_logit_bias = 0;
      while (*at) {
        char* end;
        long id = strtol(at, &end, 10);
        if (end == at || *end != ':' || params.n_logit_bias == MAX_BIAS) return usage(argv[0], "--logit-bias takes ID:BIAS,...");
        bias_ids[params.n_logit_bias] = (int32_t)id;
        at = end + 1;
        biases[params.n_logit_bias++] = (float)strtod(at, &end);
        if (end == at || (*end && *end != ',')) return usage(argv[0], "--logit-bias takes ID:BIAS,...");
        at = *end ? end + 1 : end;
      }
      params.logit_bias_tokens = bias_ids;
      params.logit_bias = biases;
    }
    else if (!strcmp(a, "--device")) device = argv[++i];
    else if (!strcmp(a, "--spec-draft-length")) cfg.draft_length = atoi(argv[++i]);
    else if (!strcmp(a, "--spec-tree-width")) cfg.spec_tree_width = atoi(argv[++i]);
    else if (!strcmp(a, "--spec-tree-nodes")) cfg.spec_tree_nodes = atoi(argv[++i]);
    else if (!strcmp(a, "--ngram-min")) cfg.ngram_min = atoi(argv[++i]);
    else if (!strcmp(a, "--ngram-max")) cfg.ngram_max = atoi(argv[++i]);
    else if (!strcmp(a, "--max-total-tokens")) cfg.max_total_seq_len = atoll(argv[++i]);
    else if (!strcmp(a, "--stop")) {
      if (params.n_stop == MAX_STOP) return usage(argv[0], "too many --stop strings");
      stop[params.n_stop++] = argv[++i];
    } else if (!strcmp(a, "--speculative-mode")) {
      const char* m = argv[++i];
      if (!strcmp(m, "disable")) cfg.speculative_mode = SPC_SPEC_DISABLE;
      else if (!strcmp(m, "ngram")) cfg.speculative_mode = SPC_SPEC_NGRAM;
      else if (!strcmp(m, "small_draft")) cfg.speculative_mode = SPC_SPEC_SMALL_DRAFT;
      else if (!strcmp(m, "suffix")) cfg.speculative_mode = SPC_SPEC_SUFFIX;
      else if (!strcmp(m, "eagle")) cfg.speculative_mode = SPC_SPEC_EAGLE;
      else if (!strcmp(m, "medusa")) cfg.speculative_mode = SPC_SPEC_MEDUSA;
      else return usage(argv[0], "--speculative-mode is one of disable, ngram, suffix, small_draft, eagle, medusa");
    } else return usage(argv[0], "unknown option");
  }
  if (!lib) return usage(argv[0], "--model-lib is required");
  if (!prompt == !prompt_ids) return usage(argv[0], "give --prompt or --prompt-ids");
  if (params.n_stop) params.stop = stop;

  char* draft_lib = additional ? strchr(additional, ',') : NULL;
  if (additional && !draft_lib) return usage(argv[0], "--additional-models takes DIR,LIB");
  if (draft_lib) *draft_lib++ = '\0';

  spc_model* model = NULL;
  spc_model* draft = NULL;
  spc_session* session = NULL;
  if (spc_model_load(model_dir, lib, device, &model) != SPC_OK) return die("loading the model");
  if (additional && spc_model_load(additional, draft_lib, device, &draft) != SPC_OK) return die("loading --additional-models");
  cfg.draft_model = draft;
  if (spc_session_create(model, &cfg, &session) != SPC_OK) return die("creating the session");
  int rc;
  if (prompt) {
    FILE* sink = as_json ? stderr : stdout;
    rc = spc_generate_text(session, prompt, raw, &params, stream || !as_json ? on_text : NULL, sink, NULL, 0, NULL);
  } else {
    size_t n_prompt = 0;
    int32_t* ids = parse_ids(prompt_ids, &n_prompt);
    if (!ids) return usage(argv[0], "--prompt-ids must be comma-separated integers");
    rc = spc_generate(session, ids, n_prompt, &params, NULL, NULL, NULL, 0, NULL);
    free(ids);
  }
  if (rc != SPC_OK) return die("generating");
  if (!as_json) {
    putchar('\n');
  } else {
    const int32_t *in, *out;
    size_t n_in, n_out;
    spc_stats s;
    spc_session_last_tokens(session, &in, &n_in, &out, &n_out);
    spc_session_stats(session, &s);
    static const char* reasons[] = {"none", "stop", "length", "cancelled"};
    printf("{");
    print_ids("prompt_token_ids", in, n_in);
    printf(", ");
    print_ids("token_ids", out, n_out);
    printf(", \"text\": ");
    const char* text = NULL;
    size_t len = 0;
    char* decoded = NULL;
    if (prompt) {
      spc_session_last_text(session, &text, &len);
    } else { /* ids in: the text from the model folder's tokenizer, when it has one it can read */
      const spc_tokenizer* tok = NULL;
      if (spc_model_tokenizer(model, &tok) == SPC_OK && spc_detokenize(tok, out, n_out, 1, NULL, 0, &len) == SPC_OK &&
          (decoded = (char*)malloc(len + 1)) && spc_detokenize(tok, out, n_out, 1, decoded, len + 1, &len) == SPC_OK) {
        text = decoded;
      }
    }
    if (text) print_json_string(text, len);
    else printf("null");
    free(decoded);
    printf(", \"finish_reason\": \"%s\", \"stats\": {\"prefill_tokens\": %lld, \"decode_tokens\": %lld, "
           "\"prefill_tokens_per_s\": %.3f, \"decode_tokens_per_s\": %.3f, \"prefill_seconds\": %.6f, "
           "\"decode_seconds\": %.6f, \"request_seconds\": %.6f, \"draft_tokens\": %lld, \"accepted_tokens\": %lld, "
           "\"verify_steps\": %lld, \"plain_steps\": %lld, \"accept_rate\": %.17g, \"mean_accepted_length\": %.17g}}\n",
           reasons[s.finish_reason], (long long)s.prefill_tokens, (long long)s.decode_tokens, s.prefill_tokens_per_s,
           s.decode_tokens_per_s, s.prefill_seconds, s.decode_seconds, s.prefill_seconds + s.decode_seconds,
           (long long)s.draft_tokens, (long long)s.accepted_tokens, (long long)s.verify_steps,
           (long long)s.plain_steps, s.accept_rate, s.mean_accepted_length);
  }
  spc_session_free(session);
  spc_model_free(draft);
  spc_model_free(model);
  return 0;
}
