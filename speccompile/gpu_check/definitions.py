"""What each figure of the GPU check's JSON means: written into the JSON itself (``definitions``)."""

DEFINITIONS = {
    "decode_tok_s": "plain greedy decoding at batch 1 through the engine's own step: decode steps after the "
                    "prefill / their wall time, median of the runs (decode_tokens new tokens each)",
    "decode_tok_s_sampled": "plain decoding at batch 1 at temperature 0.7 with top-p 0.9 (the sampling and "
                            "rejection-sampling kernels in every step): the engine's decode tok/s of the second of "
                            "two generate calls, decode_tokens new tokens each",
    "roofline_tok_s": "copy_bandwidth_gb_s (a torch device-to-device copy, bytes read + written per second) / "
                      "weight_bytes_per_token (every parameter a decode step reads: all but an untied embedding)",
    "prefill_tok_s": "prefill_prompt_tokens / the wall time of their prefill into a fresh sequence (best of 3 "
                     "after a warm-up; prompts longer than the library's chunk run as consecutive forwards)",
    "cuda_graph": "decode_tok_s's runs alternate with runs whose forwards are called, not replayed from CUDA "
                  "graphs (runtime/cuda_graph.py): their median (decode_tok_s_no_graph), whether both gave the same "
                  "tokens, and the graphs captured and replayed over the check",
    "features_step": "the verify forward of a step with an EAGLE-3 head (Model.forward of hidden, features and logits: layer features, "
                     "hidden states, logits; features and logits read on the host), one row at a time after a "
                     "16-token prefix, 48 steps: ms per step replayed from one CUDA graph (graph_ms) and called "
                     "(calls_ms), the second of two runs each, and whether every output had the same bits",
    "host_ms_per_step": "wall time of a plain engine step (propose, forward, accept, commit) at a 128-token "
                        "context less the device's busy time in it (the sum of its kernels' CUPTI times; "
                        "kernel_profile.engine_step_ctx128): Python, TVM VM dispatch, launches and copies the "
                        "device waits for. On the CPU (no profile) it is the wall time of a step less the time "
                        "blocked in a device sync before its first read of results (timings)",
    "forward_cost_vs_rows": "runtime/costs.measure_target: one target forward plus greedy verification over r "
                            "rows of a scratch sequence (best of 3 after a warm-up), relative to r = 1",
    "logits_max_abs_diff_vs_torch": "max |ours - torch float32| over the logits of a prefill (last position), a "
                                    "decode step and an 8-token forward; the torch model holds our converted "
                                    "weights (q4 dequantized); logits.max_abs_diff_vs_torch_fp16 is the same "
                                    "against torch in float16, logits.torch_fp16_vs_fp32_max_abs_diff torch's own "
                                    "fp16 error, for scale",
    "peers": "transformers on the same weights in fp16, greedy: eager generate (hf_fp16_tok_s) and generate "
             "with cache_implementation=static, which compiles the decoding forward with torch.compile "
             "(torch_compile_tok_s); tok/s = new tokens after the first / time from the first to the last",
    "speculative": "bench --one-shot: per prompt, fresh `speccompile generate --json` processes plain / spec / "
                   "spec / plain at temperature 0; speedup = plain / spec decode seconds over all prompts; "
                   "acceptance = accepted / drafted tokens; mean_accepted_length = tokens per verify step "
                   "(bonus included); identical = [prompts whose four outputs are token-identical, prompts]; per "
                   "prompt, a spec run's seconds proposing (draft_seconds), in verify forwards and acceptance "
                   "(verify_seconds) and committing and emitting (other_seconds), and cuda_graph: the graphs a "
                   "plain and a spec process captured, the wall seconds the captures took, the replays; "
                   "suffix_no_graph: the default mode again with CUDA graphs off in every process",
    "kernel_profile": "speccompile/gpu_check/profile.py: per phase, wall ms per call, device_busy_ms (the sum of its "
                      "kernels' CUPTI times), launches per call and the top kernels by device time; "
                      "engine_spec_step_ctx128 is an engine step with n-gram drafts of 4 (propose, a 5-row verify, "
                      "accept, roll back), tokens_per_step what its steps emitted",
    "capi": "the payload's prebuilt C API (spc_generate) on the same library, 2 prompts x 32 greedy tokens, plain "
            "and --ngram: identical = [runs whose token ids equal the Python engine's greedy ids, runs]; tok_s / "
            "ngram_tok_s = its decode tok/s (median), python_tok_s the engine's; libraries = the file the dynamic "
            "linker loaded for each runtime library (speccompile/gpu_check/capi.py)",
    "alt_libs": "the same model built another way (e.g. --gpu-projections portable beside the default tensor-core "
                "build), measured in the same process on the same weights: decode_tok_s, forward_cost_vs_rows, "
                "forward_ms_vs_rows, prefill_tok_s as above; greedy_ids_equal = whether its plain greedy tokens "
                "equal the default library's",
    "kernels": "speccompile/gpu_check/kernels_bench.py: each q4 projection kernel variant alone on real model "
               "shapes with random weights; us = microseconds per call at each token count (TVM's time "
               "evaluator, min of 5 x 20 calls); invariant = every row of every M-row result bit-identical to the "
               "same row projected alone (64 rows); max_err_vs_scale = max |ours - float64| / sum |x w| over 8 "
               "rows and 512 features; layers = one layer's projections summed, forward_ms x the model's layers",
    "tensor_core_refused": "null, or why the models were measured with their portable libraries (alt_libs.portable) "
                           "instead of their default tensor-core ones: the kernel bench failed, or its default "
                           "tensor-core kernel gave a row other bits than the row alone, or results far from float64 "
                           "(kernels_bench.refusal); each model's library says which it was",
}
