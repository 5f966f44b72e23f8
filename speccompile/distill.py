"""Self-distillation data for draft heads: the target's own answers and its features.

Why self-distillation: a draft head is only useful if it predicts what *this* target
says, so the training text is the target's own greedy answers to instruction prompts
(``../shared/DRAFT_TRAINING.md``: chat data the target produced is worth far more per
token than generic text). The prompts are written here -- topics crossed with task
templates -- and never taken from the benchmark sets.

Two resumable stages, both on our compiled engine (no torch needed):

1. ``generate_answers``: batched greedy generation; one JSON line per conversation in
   ``conversations.jsonl`` (prompt ids, answer ids). Re-running skips what is there.
2. ``extract_features``: one forward per conversation returning the final-normed hidden
   state of every token (``forward_hidden``), stored as fp16 shards ``feats_NNNN.npz``
   with the token ids beside them. These are what EAGLE regresses and Medusa reads.
"""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np

TOPICS = [
    "binary search", "photosynthesis", "the French Revolution", "compound interest", "TCP handshakes",
    "black holes", "vaccines", "recursion", "supply and demand", "plate tectonics", "hash tables",
    "the water cycle", "public key cryptography", "inflation", "neural networks", "the Roman Empire",
    "climate change", "unit testing", "DNA replication", "the stock market", "garbage collection",
    "volcanoes", "the Renaissance", "probability", "electric cars", "sorting algorithms", "sleep",
    "the immune system", "version control with git", "renewable energy", "linked lists", "gravity",
    "the printing press", "SQL joins", "coffee brewing", "marathon training", "time zones",
    "regular expressions", "the moon landing", "bread baking", "Docker containers", "rainforests",
    "prime numbers", "jazz music", "remote work", "the Pythagorean theorem", "memory leaks",
    "chess openings", "urban gardening", "REST APIs", "the Cold War", "entropy", "caching",
    "job interviews", "Shakespeare's plays", "matrix multiplication", "ocean tides", "budgeting",
    "concurrency bugs", "the scientific method",
    "quantum computing", "the Silk Road", "photosynthetic algae", "machine learning bias", "bees and pollination",
    "the Great Depression", "operating system schedulers", "minimalist living", "the human heart",
    "blockchain", "ancient Egypt", "solar panels", "password security", "the Olympic Games", "earthquakes",
    "functional programming", "the Industrial Revolution", "meditation", "antibiotic resistance",
    "the periodic table", "open source software", "coral reefs", "interest rates", "the Internet's history",
    "dinosaurs", "cloud computing", "nutrition labels", "the electoral college", "3D printing", "glaciers",
    "object-oriented design", "impressionist painting", "startups", "the speed of light", "composting",
    "Kubernetes", "World War I", "mushrooms", "database indexes", "habit formation", "hurricanes",
    "binary numbers", "the Maya civilization", "electric guitars", "compilers", "migration of birds",
    "credit scores", "statistics and p-values", "the human brain", "web accessibility", "tea culture",
    "graph algorithms", "the Apollo program", "public speaking", "nuclear power", "dynamic programming",
    "the Amazon river", "personal finance", "Linux file permissions", "the theory of evolution",
    "recycling plastics", "team management", "JavaScript promises", "the Byzantine Empire", "wind turbines",
    "chocolate making", "encryption at rest", "the Mona Lisa", "calculus", "customer support", "bicycles",
    "load balancers", "the Ottoman Empire", "soil erosion", "negotiation", "virtual memory", "spices",
    "the Moon's phases", "code reviews", "photography basics", "vitamins", "airplanes and lift",
    "data visualization", "the Beatles", "microservices", "desert ecosystems", "writing a resume",
    "Bayes' theorem", "the Eiffel Tower", "type systems", "lighthouses", "podcasting",
]

TEMPLATES = [
    "Explain {t} to a curious twelve-year-old.",
    "Give me three surprising facts about {t}.",
    "Write a short blog post introduction about {t}.",
    "What are the most common misconceptions about {t}?",
    "Summarize {t} in five bullet points.",
    "Write a haiku and then a limerick about {t}.",
    "Compare {t} with something from everyday life and explain the analogy.",
    "I have an exam tomorrow on {t}. What should I review first?",
    "Write a dialogue between a teacher and a student about {t}.",
    "What are the pros and cons of learning about {t} on your own?",
    "Draft an email to a colleague recommending a book about {t}.",
    "List five interview questions about {t} with short answers.",
    "Write a Python function related to {t} and explain how it works.",
    "How would you explain {t} in a job interview, step by step?",
    "Tell a short story in which {t} plays a key role.",
    "What is the history of {t}, briefly?",
    "Give a step-by-step plan for a one-week project about {t}.",
    "Write a product description for an app that teaches {t}.",
    "Answer as a JSON object with keys 'summary' and 'keywords': what is {t}?",
    "Rewrite this sentence more formally: '{t} is kind of cool and everyone should get it.'",
    "Write a short poem about {t}.",
    "What would a beginner get wrong about {t}, and how can they avoid it?",
    "Create a quiz with four multiple-choice questions about {t}.",
    "Describe {t} in exactly three sentences.",
    "Write a persuasive paragraph arguing that everyone should understand {t}.",
    "Explain {t} using a cooking analogy.",
    "What are the key terms someone should know about {t}? Define each briefly.",
    "Write a tweet-length summary of {t}, then a longer explanation.",
    "How has {t} changed over the last fifty years?",
    "Pretend you are a tour guide and explain {t} to visitors.",
    "Write a short lesson plan for teaching {t} to high school students.",
    "Give an example problem about {t} and solve it step by step.",
    "What questions would an expert ask about {t}? Answer two of them.",
    "Write a FAQ with three questions and answers about {t}.",
    "Explain the relationship between {t} and everyday technology.",
]


def instruction_prompts(n: int, seed: int = 0) -> list[str]:
    """n distinct instruction prompts, shuffled reproducibly (topics x templates)."""
    pairs = list(itertools.product(TEMPLATES, TOPICS))
    random.Random(seed).shuffle(pairs)
    if n > len(pairs):
        raise ValueError(f"at most {len(pairs)} distinct prompts are available, {n} asked")
    return [tpl.format(t=topic) for tpl, topic in pairs[:n]]


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by an interrupted run: regenerate from there
    return rows


def generate_answers(engine, out_dir: Path, num_prompts: int, max_tokens: int, batch: int,
                     progress: bool = True) -> list[dict]:
    """Greedy answers of the target to the instruction prompts (resumable)."""
    from tqdm import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "conversations.jsonl"
    rows = _read_jsonl(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # drop a torn last line
    prompts = instruction_prompts(num_prompts)
    todo = prompts[len(rows):]
    bar = tqdm(total=len(prompts), initial=len(rows), desc="self-distill", unit="prompt", disable=not progress)
    with path.open("a") as f:
        for i in range(0, len(todo), batch):
            chunk = todo[i:i + batch]
            ids = [engine.encode_prompt(p) for p in chunk]
            for p, pid, res in zip(chunk, ids, engine.generate_batch(ids, max_tokens=max_tokens)):
                row = {"prompt": p, "prompt_ids": pid, "answer_ids": res.token_ids}
                f.write(json.dumps(row) + "\n")
                rows.append(row)
            f.flush()
            bar.update(len(chunk))
    bar.close()
    return rows


def _shard_holds(path: Path, members: list[dict]) -> bool:
    """A shard on disk is reused only if it holds exactly these conversations: a rerun with
    more prompts packs new conversations into the last shard, which must then be redone."""
    with np.load(path) as z:
        return (len(z["starts"]) == len(members)
                and len(z["tokens"]) == sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in members))


def extract_features(model, out_dir: Path, rows: list[dict], shard_tokens: int = 65536,
                     progress: bool = True) -> list[Path]:
    """Final-normed hidden states of every token of every conversation, as fp16 shards
    (resumable per shard). Each shard holds ``tokens`` [n], ``feats`` [n, hidden] and
    ``starts``/``answer_start`` per conversation."""
    from tqdm import tqdm

    shards, cur, size = [], [], 0
    for i, r in enumerate(rows):  # conversations in order, ~shard_tokens tokens per shard
        cur.append(i)
        size += len(r["prompt_ids"]) + len(r["answer_ids"])
        if size >= shard_tokens or i == len(rows) - 1:
            shards.append(cur)
            cur, size = [], 0
    paths = []
    bar = tqdm(total=len(rows), desc="features", unit="conv", disable=not progress)
    for s, members in enumerate(shards):
        path = out_dir / f"feats_{s:04d}.npz"
        paths.append(path)
        if path.exists() and _shard_holds(path, [rows[j] for j in members]):
            bar.update(len(members))
            continue
        toks, feats, starts, ans = [], [], [], []
        kv = model.create_kv_cache(max(len(rows[j]["prompt_ids"]) + len(rows[j]["answer_ids"]) for j in members) + 16)
        for j in members:
            seq = rows[j]["prompt_ids"] + rows[j]["answer_ids"]
            kv.add_sequence(0)
            hidden = model.forward_hidden(kv, [0], [seq]).numpy()
            kv.remove_sequence(0)
            starts.append(sum(len(t) for t in toks))
            ans.append(len(rows[j]["prompt_ids"]))
            toks.append(np.asarray(seq, np.int32))
            feats.append(hidden.astype(np.float16))
            bar.update(1)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, tokens=np.concatenate(toks), feats=np.concatenate(feats),
                 starts=np.asarray(starts, np.int64), answer_start=np.asarray(ans, np.int64))
        tmp.rename(path)
    bar.close()
    return paths
