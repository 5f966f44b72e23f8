"""Written prompt families for a coder target: code writing, debugging, explaining,
refactoring, tests, shell, SQL and data munging -- the requests a code assistant gets.

Why written families beside Magpie (speccompile/training/magpie.py): the target's own sampled user
turns follow its distribution but drift toward its favourite requests; these families pin
down registers a coder model must answer well (a pasted snippet with a symptom, an error
message, a schema and a query) with content we control, so a draft head sees code blocks,
diffs of snippets and stack traces in the *answers*. Snippets are short and realistic,
several with a deliberate bug and the symptom a user would report.

Every list here is split by ``partition``: every fifth item is reserved for the held-out
prompt set, so checkpoint selection measures prompts about other snippets and tasks, in
other styles (``HELD_OUT_CODE_FAMILIES``), never the training prompts reworded.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from speccompile.training.prompts import LANGS, TASKS, partition


@dataclass(frozen=True)
class Snippet:
    lang: str  # the code fence's language
    code: str
    bug: str | None = None  # a buggy variant of ``code``
    symptom: str | None = None  # what a user sees when running ``bug``


LANG_NAMES = {"python": "Python", "js": "JavaScript", "ts": "TypeScript", "java": "Java", "go": "Go", "rust": "Rust",
              "c": "C", "cpp": "C++", "sql": "SQL", "bash": "Bash"}
TEST_FRAMEWORKS = {"python": ["pytest", "unittest"], "js": ["Jest", "Vitest", "Mocha"], "ts": ["Jest", "Vitest"],
                   "java": ["JUnit 5"], "go": ["the testing package"], "rust": ["Rust's built-in #[test] functions"],
                   "c": ["plain assert() calls"], "cpp": ["GoogleTest", "Catch2"], "sql": ["a few example rows"],
                   "bash": ["bats"]}

SNIPPETS = [
    Snippet("python", "def moving_average(values, window):\n    result = []\n    for i in range(len(values) - window + 1):"
            "\n        chunk = values[i:i + window]\n        result.append(sum(chunk) / window)\n    return result",
            "def moving_average(values, window):\n    result = []\n    for i in range(len(values) - window):\n"
            "        chunk = values[i:i + window]\n        result.append(sum(chunk) / window)\n    return result",
            "The last average is always missing from the result."),
    Snippet("python", "from collections import Counter\n\n\ndef top_words(path, n=10):\n    with open(path, encoding=\"utf-8\") "
            "as f:\n        words = f.read().lower().split()\n    return Counter(words).most_common(n)"),
    Snippet("python", "def add_item(item, items=None):\n    if items is None:\n        items = []\n    items.append(item)\n"
            "    return items", "def add_item(item, items=[]):\n    items.append(item)\n    return items",
            "Items from earlier calls keep showing up in later calls."),
    Snippet("python", "def binary_search(arr, target):\n    lo, hi = 0, len(arr) - 1\n    while lo <= hi:\n        mid = "
            "(lo + hi) // 2\n        if arr[mid] == target:\n            return mid\n        if arr[mid] < target:\n"
            "            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1",
            "def binary_search(arr, target):\n    lo, hi = 0, len(arr) - 1\n    while lo < hi:\n        mid = "
            "(lo + hi) // 2\n        if arr[mid] == target:\n            return mid\n        if arr[mid] < target:\n"
            "            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1",
            "It returns -1 for a one-element list even when the element is the target."),
    Snippet("python", "import functools\nimport time\n\n\ndef retry(times=3, delay=0.5):\n    def decorator(fn):\n"
            "        @functools.wraps(fn)\n        def wrapper(*args, **kwargs):\n            for attempt in range(times):\n"
            "                try:\n                    return fn(*args, **kwargs)\n                except Exception:\n"
            "                    if attempt == times - 1:\n                        raise\n"
            "                    time.sleep(delay * 2 ** attempt)\n        return wrapper\n    return decorator"),
    Snippet("python", "class BankAccount:\n    def __init__(self, owner, balance=0):\n        self.owner = owner\n"
            "        self.balance = balance\n\n    def withdraw(self, amount):\n        if amount > self.balance:\n"
            "            raise ValueError(\"insufficient funds\")\n        self.balance -= amount\n        return self.balance",
            "class BankAccount:\n    def __init__(self, owner, balance=0):\n        self.owner = owner\n"
            "        self.balance = balance\n\n    def withdraw(self, amount):\n        if amount > balance:\n"
            "            raise ValueError(\"insufficient funds\")\n        self.balance -= amount\n        return self.balance",
            "Calling withdraw raises NameError: name 'balance' is not defined."),
    Snippet("python", "import asyncio\n\nimport aiohttp\n\n\nasync def fetch_all(urls):\n    async with aiohttp.ClientSession() "
            "as session:\n        async def fetch(url):\n            async with session.get(url) as resp:\n"
            "                return await resp.text()\n        return await asyncio.gather(*(fetch(u) for u in urls))"),
    Snippet("python", "def remove_negatives(nums):\n    return [n for n in nums if n >= 0]",
            "def remove_negatives(nums):\n    for n in nums:\n        if n < 0:\n            nums.remove(n)\n    return nums",
            "For [-1, -2, 3] it returns [-2, 3], so some negative numbers survive."),
    Snippet("js", "function debounce(fn, wait) {\n  let timer;\n  return function (...args) {\n    clearTimeout(timer);\n"
            "    timer = setTimeout(() => fn.apply(this, args), wait);\n  };\n}"),
    Snippet("js", "async function loadUsers() {\n  const res = await fetch(\"/api/users\");\n  if (!res.ok) throw new Error"
            "(`HTTP ${res.status}`);\n  const users = await res.json();\n  return users.filter(u => u.active).map(u => "
            "u.name);\n}", "async function loadUsers() {\n  const res = await fetch(\"/api/users\");\n  if (!res.ok) throw "
            "new Error(`HTTP ${res.status}`);\n  const users = res.json();\n  return users.filter(u => u.active).map(u => "
            "u.name);\n}", "I get TypeError: users.filter is not a function."),
    Snippet("js", "for (let i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}",
            "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}",
            "It prints 3 three times instead of 0, 1, 2."),
    Snippet("ts", "interface Order { id: number; customer: string; total: number }\n\nfunction totalsByCustomer(orders: "
            "Order[]): Record<string, number> {\n  return orders.reduce((acc, o) => {\n    acc[o.customer] = "
            "(acc[o.customer] ?? 0) + o.total;\n    return acc;\n  }, {} as Record<string, number>);\n}",
            "interface Order { id: number; customer: string; total: number }\n\nfunction totalsByCustomer(orders: "
            "Order[]): Record<string, number> {\n  return orders.reduce((acc, o) => {\n    acc[o.customer] = "
            "(acc[o.customer] ?? 0) + o.total;\n  }, {} as Record<string, number>);\n}",
            "With two or more orders it crashes with TypeError: Cannot read properties of undefined."),
    Snippet("java", "public static int countVowels(String s) {\n    int count = 0;\n    for (char c : s.toLowerCase()."
            "toCharArray()) {\n        if (\"aeiou\".indexOf(c) >= 0) {\n            count++;\n        }\n    }\n"
            "    return count;\n}"),
    Snippet("java", "Scanner sc = new Scanner(System.in);\nString input = sc.nextLine();\nif (input.equals(\"yes\")) {\n"
            "    System.out.println(\"Confirmed\");\n} else {\n    System.out.println(\"Cancelled\");\n}",
            "Scanner sc = new Scanner(System.in);\nString input = sc.nextLine();\nif (input == \"yes\") {\n"
            "    System.out.println(\"Confirmed\");\n} else {\n    System.out.println(\"Cancelled\");\n}",
            "It always prints Cancelled, even when I type yes."),
    Snippet("go", "func wordCount(s string) map[string]int {\n\tcounts := make(map[string]int)\n\tfor _, w := range "
            "strings.Fields(s) {\n\t\tcounts[strings.ToLower(w)]++\n\t}\n\treturn counts\n}",
            "func wordCount(s string) map[string]int {\n\tvar counts map[string]int\n\tfor _, w := range "
            "strings.Fields(s) {\n\t\tcounts[strings.ToLower(w)]++\n\t}\n\treturn counts\n}",
            "It panics with: assignment to entry in nil map."),
    Snippet("go", "var wg sync.WaitGroup\nfor _, url := range urls {\n\twg.Add(1)\n\tgo func(u string) {\n\t\tdefer "
            "wg.Done()\n\t\tfetch(u)\n\t}(url)\n}\nwg.Wait()",
            "var wg sync.WaitGroup\nfor _, url := range urls {\n\tgo func(u string) {\n\t\twg.Add(1)\n\t\tdefer "
            "wg.Done()\n\t\tfetch(u)\n\t}(url)\n}\nwg.Wait()",
            "Sometimes the program exits before all the fetches have finished."),
    Snippet("rust", "fn longest<'a>(a: &'a str, b: &'a str) -> &'a str {\n    if a.len() >= b.len() { a } else { b }\n}",
            "fn longest(a: &str, b: &str) -> &str {\n    if a.len() >= b.len() { a } else { b }\n}",
            "The compiler says error[E0106]: missing lifetime specifier."),
    Snippet("rust", "fn average(values: &[f64]) -> Option<f64> {\n    if values.is_empty() {\n        return None;\n    }\n"
            "    Some(values.iter().sum::<f64>() / values.len() as f64)\n}"),
    Snippet("c", "char *copy_string(const char *src) {\n    size_t n = strlen(src);\n    char *dst = malloc(n + 1);\n"
            "    if (dst == NULL) return NULL;\n    memcpy(dst, src, n + 1);\n    return dst;\n}",
            "char *copy_string(const char *src) {\n    size_t n = strlen(src);\n    char *dst = malloc(n);\n"
            "    if (dst == NULL) return NULL;\n    memcpy(dst, src, n + 1);\n    return dst;\n}",
            "Valgrind reports an invalid write of size 1."),
    Snippet("cpp", "std::vector<int> evens(const std::vector<int>& v) {\n    std::vector<int> out;\n    std::copy_if(v.begin()"
            ", v.end(), std::back_inserter(out),\n                 [](int x) { return x % 2 == 0; });\n    return out;\n}"),
    Snippet("sql", "SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS revenue\nFROM customers c\nLEFT JOIN orders o\n"
            "  ON o.customer_id = c.id AND o.created_at >= '2024-01-01'\nGROUP BY c.name\nORDER BY revenue DESC;",
            "SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS revenue\nFROM customers c\nLEFT JOIN orders o ON "
            "o.customer_id = c.id\nWHERE o.created_at >= '2024-01-01'\nGROUP BY c.name\nORDER BY revenue DESC;",
            "Customers without orders this year disappear from the result, although I used a LEFT JOIN."),
    Snippet("bash", "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.log; do\n  gzip \"$f\"\ndone",
            "#!/usr/bin/env bash\nfor f in $(ls *.log); do\n  gzip $f\ndone",
            "It breaks on file names that contain spaces."),
    Snippet("python", "import pandas as pd\n\ndf = pd.read_csv(\"sales.csv\", parse_dates=[\"date\"])\nmonthly = df.groupby("
            "df[\"date\"].dt.to_period(\"M\"))[\"amount\"].sum()\nprint(monthly.tail())",
            "import pandas as pd\n\ndf = pd.read_csv(\"sales.csv\")\nmonthly = df.groupby(df[\"date\"].dt.to_period(\"M\"))"
            "[\"amount\"].sum()\nprint(monthly.tail())",
            "I get AttributeError: Can only use .dt accessor with datetimelike values."),
    Snippet("python", "from functools import lru_cache\n\n\n@lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 "
            "else fib(n - 1) + fib(n - 2)", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
            "fib(40) takes forever to finish."),
    Snippet("js", "const counts = {};\nfor (const word of text.toLowerCase().match(/[a-z']+/g) ?? []) {\n  counts[word] = "
            "(counts[word] || 0) + 1;\n}\nconst top = Object.entries(counts).sort((a, b) => b[1] - a[1]).slice(0, 5);"),
]

TASKS_INF = [
    "read a JSON config file and check that the required keys are present", "retry an HTTP request with exponential "
    "backoff", "parse command-line arguments with subcommands", "flatten a nested dictionary into dot-separated keys",
    "validate a password against a set of rules", "compute the Levenshtein distance between two strings",
    "split a list into batches of n items", "rate-limit calls to a function", "download several files concurrently",
    "watch a folder and react to new files", "convert a CSV file to JSON", "generate a random secure password",
    "detect a cycle in a linked list", "implement a trie with insert and prefix search",
    "serialize a binary tree to a string and back", "find the shortest path in a weighted graph with Dijkstra's "
    "algorithm", "implement a thread-safe counter", "read a huge file line by line without loading it into memory",
    "paginate through the results of a REST API", "cache an expensive function's results for five minutes",
    "compute the SHA-256 checksum of a file", "send an email with an attachment", "resize every image in a folder",
    "implement a small event emitter", "run a task every ten minutes", "parse dates written in several formats",
    "pretty-print a list of records as a table in the terminal", "run a parameterized query against PostgreSQL",
    "compute the running median of a stream of numbers", "format a byte count as a human-readable size",
    "check whether two strings are anagrams", "implement a min-heap from scratch", "tokenize and evaluate an "
    "arithmetic expression", "count lines of code in a project, skipping blank lines and comments", "deep-merge two "
    "dictionaries", "implement a producer-consumer queue with two threads", "throttle scroll events in the browser",
    "read settings from environment variables with defaults", "write a logger that rotates its files daily",
    "multiply two matrices without any library", "generate all permutations of a list", "solve the N-Queens puzzle",
    "implement a token-bucket rate limiter", "strip HTML tags from a string", "find the most common element of a "
    "list", "count business days between two dates", "encode and decode run-length compressed strings",
    "check whether a Sudoku grid is valid", "convert a number to its English words", "find all files with a given "
    "extension recursively",
]
FRAMEWORKS = [("Flask", "REST API"), ("FastAPI", "REST API"), ("Express", "REST API"), ("Django", "app"),
              ("React", "component"), ("Vue", "component"), ("Spring Boot", "service"), ("Tkinter", "desktop app"),
              ("Streamlit", "dashboard"), ("click", "command-line tool"), ("Go net/http", "server"),
              ("Next.js", "page")]
APP_TASKS = ["manages a to-do list", "shows the weather for a city", "lets users upload and list images",
             "tracks expenses by category", "stores and searches notes", "runs a multiple-choice quiz",
             "converts between currencies", "shortens URLs", "manages a small library's books and loans",
             "shows a paginated, searchable list of products", "lets users register and log in",
             "schedules appointments", "keeps a leaderboard for a game", "collects feedback from a form"]
ERRORS = [
    ("Python", "TypeError: 'NoneType' object is not subscriptable"), ("JavaScript", "TypeError: Cannot read "
    "properties of undefined (reading 'map')"), ("Java", "java.lang.NullPointerException"), ("Rust", "error[E0502]: "
    "cannot borrow `v` as mutable because it is also borrowed as immutable"), ("Go", "fatal error: all goroutines are "
    "asleep - deadlock!"), ("C", "Segmentation fault (core dumped)"), ("Python", "ModuleNotFoundError: No module named"
    " 'requests'"), ("git", "fatal: refusing to merge unrelated histories"), ("Docker", "permission denied while "
    "trying to connect to the Docker daemon socket"), ("PostgreSQL", "ERROR: column \"total\" must appear in the "
    "GROUP BY clause or be used in an aggregate function"), ("npm", "npm ERR! ERESOLVE unable to resolve dependency "
    "tree"), ("Python", "RecursionError: maximum recursion depth exceeded"), ("C++", "undefined reference to `vtable "
    "for Shape'"), ("Python", "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0"),
    ("JavaScript", "Uncaught (in promise) TypeError: Failed to fetch"), ("Java", "java.util."
    "ConcurrentModificationException"), ("Python", "ValueError: too many values to unpack (expected 2)"),
    ("React", "Warning: Each child in a list should have a unique \"key\" prop."), ("TypeScript", "error TS2339: "
    "Property 'id' does not exist on type '{}'."), ("Kubernetes", "CrashLoopBackOff"), ("pip", "error: externally-"
    "managed-environment"), ("SSH", "Permission denied (publickey)."), ("MySQL", "ERROR 1045 (28000): Access denied "
    "for user 'root'@'localhost'"), ("Python", "IndentationError: unexpected indent"),
]
CONTEXTS = ["when I run my script", "after upgrading my dependencies", "only in production, not on my laptop",
            "in our CI pipeline", "right after the program starts", "when the input file is empty",
            "every few hours in a long-running service", "after merging a colleague's branch"]
SHELL_TASKS = [
    "find all files larger than 100 MB under /var", "count the lines of every .py file in a project",
    "rename all .jpeg files in a folder to .jpg", "kill the process listening on port 8080",
    "show the ten most frequent IP addresses in an nginx access log", "archive a directory but skip node_modules",
    "follow a log file and print only lines containing ERROR", "replace a string in every file of a directory",
    "check disk usage per directory, largest first", "download a file with curl and retry on failure",
    "run a command for each line of a text file in parallel", "find which process uses the most memory",
    "show the last 100 lines of a Docker container's logs", "copy a folder to a remote server with rsync",
    "print the second column of a CSV file", "generate an SSH key and add it to the agent",
    "list the files changed in the last 24 hours", "find duplicate files by checksum", "schedule a backup script "
    "to run every night at 2am", "convert all WAV files in a folder to MP3", "count how many times each word "
    "appears in a file", "batch-resize images to 800 pixels wide",
]
GIT_TASKS = ["undo the last commit but keep my changes", "delete local branches already merged into main",
             "squash my last four commits into one", "see who last changed each line of a file",
             "move uncommitted changes to a new branch", "recover a branch I deleted by accident",
             "remove a file from the repository but keep it on disk", "show the diff between two tags",
             "rebase my feature branch onto the latest main", "find the commit that introduced a bug"]
SCHEMAS = [
    ("employees(id, name, department_id, salary, hired_at)\ndepartments(id, name)",
     ["find the three highest-paid employees in each department", "list departments with no employees",
      "compute the average salary per department, highest first", "find employees hired in the last 90 days",
      "find the second highest salary in the company", "show each employee's salary next to their department's "
      "average"]),
    ("customers(id, name, email, country)\norders(id, customer_id, total, created_at)",
     ["list customers who have never placed an order", "compute monthly revenue for 2023",
      "find email addresses that appear more than once", "compute a running total of revenue by day",
      "count orders per country, keeping only countries with more than ten orders",
      "find each customer's first order date and total spent"]),
    ("products(id, name, category, price)\norder_items(order_id, product_id, quantity)",
     ["find the five best-selling products by quantity", "compute revenue per category",
      "find products that were never ordered", "find the most expensive product in each category"]),
    ("page_views(user_id, url, viewed_at)\nusers(id, signup_date, plan)",
     ["compute daily active users for the last 30 days", "find users who viewed a page on three consecutive days",
      "compute the share of paying users who visited /pricing", "find each user's most visited URL"]),
]
DIALECTS = ["PostgreSQL", "MySQL", "SQLite", "SQL Server", "BigQuery"]
DATAFRAMES = [
    ("date, store, product, units, price",
     ["compute total revenue per store per month", "find the best-selling product in each store",
      "pivot it so that each store is a column of weekly units", "fill missing prices with the product's median"]),
    ("user_id, event, timestamp",
     ["count events per user per day", "compute the time between consecutive events of each user",
      "keep only each user's latest event", "find users whose first event was 'signup'"]),
    ("name, age, city, salary",
     ["remove duplicate rows but keep the last occurrence", "bin the ages into groups of ten years",
      "one-hot encode the city column", "compute the salary percentile of each person within their city"]),
]
REGEX_TARGETS = ["an email address", "a US phone number in several common formats", "an ISO 8601 date",
                 "a hex color code like #1a2b3c", "an IPv4 address", "a URL with an optional port",
                 "a semantic version such as 1.4.2-beta", "words that start with a capital letter",
                 "a price like $1,299.99", "a UUID"]
JSON_SAMPLES = [
    '{"users": [{"id": 1, "name": "Ada", "tags": ["admin", "ops"]}, {"id": 2, "name": "Linus", "tags": []}]}',
    '{"orders": [{"id": "A17", "items": [{"sku": "X1", "qty": 2, "price": 9.5}, {"sku": "Y4", "qty": 1, '
    '"price": 20}]}, {"id": "A18", "items": []}]}',
    '{"city": "Oslo", "forecast": [{"day": "Mon", "high": 7, "low": 1}, {"day": "Tue", "high": 5, "low": -2}]}',
]
JSON_TASKS = ["flattens it into a CSV file", "computes a total per top-level record", "validates that every record "
              "has the expected fields", "converts it into a pandas DataFrame"]
LOG_LINES = ["2024-03-07 14:02:11,532 ERROR [worker-3] payment.service: Timeout after 30s (order=8841)",
             '192.168.1.20 - - [07/Mar/2024:14:02:11 +0000] "GET /api/items?page=2 HTTP/1.1" 200 5123',
             "Mar  7 14:02:11 web01 sshd[2214]: Failed password for invalid user admin from 203.0.113.9 port 52211"]


def _snippet(rng: random.Random, held_out: bool, buggy: bool = False) -> Snippet:
    pool = [s for s in partition(SNIPPETS, held_out) if s.bug or not buggy]
    return rng.choice(pool)


def _fence(s: Snippet, code: str | None = None) -> str:
    return f"```{s.lang}\n{code or s.code}\n```"


def _language_for(task: str, rng: random.Random) -> str:
    """A language the task makes sense in (the browser is JavaScript's, dictionaries Python's)."""
    if "browser" in task:
        return rng.choice(["JavaScript", "TypeScript"])
    if "dictionar" in task:
        return "Python"
    return rng.choice(LANGS[:8])


def code_write(rng: random.Random, held_out: bool = False) -> str:
    lang = rng.choice(LANGS[:8])
    if rng.random() < 0.3:  # the older coding family's wording (speccompile/training/prompts.py)
        return rng.choice(["Write a {lang} function that {task}. Include a short example.",
                           "Implement a function in {lang} that {task}, and explain its time complexity."]).format(
            lang=lang, task=rng.choice(partition(TASKS, held_out)))
    task = rng.choice(partition(TASKS_INF, held_out))
    return rng.choice([
        "Write a {lang} function to {task}.", "How do I {task} in {lang}?",
        "Can you write {lang} code to {task}? Please keep it simple and add comments.",
        "I need a {lang} program to {task}. What's a clean way to do it?",
        "Show me how to {task} in {lang}, and mention the edge cases.",
        "What's the idiomatic way to {task} in {lang}? Show an example.",
    ]).format(lang=_language_for(task, rng), task=task)


def code_app(rng: random.Random, held_out: bool = False) -> str:
    fw, kind = rng.choice(partition(FRAMEWORKS, held_out))
    return rng.choice([
        "Build a small {fw} {kind} that {app}. Show the full code.",
        "Create a {fw} {kind} that {app}, and explain how to run it.",
        "How should I structure a {fw} {kind} that {app}? Give me the file layout and the main code.",
    ]).format(fw=fw, kind=kind, app=rng.choice(partition(APP_TASKS, held_out)))


def code_debug(rng: random.Random, held_out: bool = False) -> str:
    s = _snippet(rng, held_out, buggy=True)
    return rng.choice([
        "{symptom} Here's the code:\n\n{code}\n\nHow do I fix it?",
        "My {lang} code has a problem. {symptom}\n\n{code}\n\nWhat am I doing wrong?",
        "Can you find the bug?\n\n{code}\n\n{symptom}",
    ]).format(symptom=s.symptom, code=_fence(s, s.bug), lang=LANG_NAMES[s.lang])


def code_error(rng: random.Random, held_out: bool = False) -> str:
    tool, err = rng.choice(partition(ERRORS, held_out))
    return rng.choice([
        "I'm getting `{err}` {ctx}. What does it mean and how do I fix it?",
        "What causes this {tool} error {ctx}?\n\n{err}",
        "{tool} keeps failing with:\n\n{err}\n\nThis happens {ctx}. How can I debug it?",
    ]).format(tool=tool, err=err, ctx=rng.choice(CONTEXTS))


def code_explain(rng: random.Random, held_out: bool = False) -> str:
    s = _snippet(rng, held_out)
    return rng.choice([
        "Explain what this {lang} code does:\n\n{code}",
        "Can you walk me through this code line by line?\n\n{code}",
        "What is the time and space complexity of this code?\n\n{code}",
        "I found this in our codebase. What does it do, and is anything about it risky?\n\n{code}",
        "Explain this {lang} snippet to someone who is just starting to program:\n\n{code}",
    ]).format(lang=LANG_NAMES[s.lang], code=_fence(s))


def code_refactor(rng: random.Random, held_out: bool = False) -> str:
    s = _snippet(rng, held_out)
    other = rng.choice([n for k, n in LANG_NAMES.items() if k not in (s.lang, "sql", "bash")])
    return rng.choice([
        "Refactor this {lang} code to make it more readable:\n\n{code}",
        "Add type annotations and documentation to this code:\n\n{code}",
        "Rewrite this {lang} code in {other}:\n\n{code}",
        "How can I make this faster or more memory-efficient?\n\n{code}",
        "Make this code handle invalid input gracefully:\n\n{code}",
    ]).format(lang=LANG_NAMES[s.lang], code=_fence(s), other=other)


def code_tests(rng: random.Random, held_out: bool = False) -> str:
    s = _snippet(rng, held_out)
    return rng.choice([
        "Write unit tests for this code using {fw}:\n\n{code}",
        "What edge cases should I test for this code? Then write the tests with {fw}.\n\n{code}",
        "Write a few test cases that would catch bugs in this code ({fw}):\n\n{code}",
    ]).format(fw=rng.choice(TEST_FRAMEWORKS[s.lang]), code=_fence(s))


def shell(rng: random.Random, held_out: bool = False) -> str:
    if rng.random() < 0.3:
        return rng.choice(["What's the git command to {t}?", "How do I {t} with git?",
                           "In git, how can I {t}? Explain what each command does."]).format(
            t=rng.choice(partition(GIT_TASKS, held_out)))
    return rng.choice([
        "How do I {t} from the Linux command line?", "Give me a one-liner to {t}.",
        "Write a bash script to {t}, with error handling and a usage message.",
        "How can I {t} in PowerShell?", "What's the fastest shell command to {t} on macOS?",
    ]).format(t=rng.choice(partition(SHELL_TASKS, held_out)))


def sql(rng: random.Random, held_out: bool = False) -> str:
    schema, tasks = rng.choice(SCHEMAS)
    return rng.choice([
        "Given these tables:\n\n{schema}\n\nWrite a SQL query to {task}.",
        "Using {dialect}, write a query to {task}. The tables are:\n\n{schema}",
        "How would I {task} in SQL? My tables look like this:\n\n{schema}",
    ]).format(schema=schema, task=rng.choice(partition(tasks, held_out)), dialect=rng.choice(DIALECTS))


def data(rng: random.Random, held_out: bool = False) -> str:
    r = rng.random()
    if r < 0.4:
        cols, tasks = rng.choice(DATAFRAMES)
        return rng.choice(["I have a pandas DataFrame with columns {cols}. How do I {task}?",
                           "With pandas, how can I {task}? My data has the columns {cols}.",
                           "Using polars or pandas, {task}. The columns are: {cols}."]).format(
            cols=cols, task=rng.choice(partition(tasks, held_out)))
    if r < 0.65:
        return rng.choice(["Write a regular expression that matches {t}, and show how to use it in {lang}.",
                           "What regex would match {t}? Explain each part of it."]).format(
            t=rng.choice(partition(REGEX_TARGETS, held_out)), lang=rng.choice(["Python", "JavaScript", "Go", "Java"]))
    if r < 0.85:
        return "Here is a JSON response from an API:\n\n```json\n{j}\n```\n\nWrite {lang} code that {t}.".format(
            j=rng.choice(JSON_SAMPLES), lang=rng.choice(["Python", "JavaScript", "Go"]),
            t=rng.choice(partition(JSON_TASKS, held_out)))
    return ("Parse log lines like this one and extract the timestamp, the level or status, and the message:\n\n{log}"
            "\n\nUse {lang}.").format(log=rng.choice(LOG_LINES), lang=rng.choice(["Python", "Go", "awk", "JavaScript"]))


# ------------------------------------------------------------------ held-out styles
TRACEBACKS = [
    "Traceback (most recent call last):\n  File \"app.py\", line 42, in <module>\n    main()\n  File \"app.py\", "
    "line 37, in main\n    total = sum(row[\"amount\"] for row in rows)\nKeyError: 'amount'",
    "Exception in thread \"main\" java.lang.ArrayIndexOutOfBoundsException: Index 5 out of bounds for length 5\n"
    "\tat com.example.Report.build(Report.java:58)\n\tat com.example.Main.main(Main.java:12)",
    "thread 'main' panicked at src/main.rs:14:37:\ncalled `Option::unwrap()` on a `None` value\nnote: run with "
    "`RUST_BACKTRACE=1` environment variable to display a backtrace",
    "node:internal/process/promises:288\n            triggerUncaughtException(err, true /* fromPromise */);\n"
    "            ^\n\nError: connect ECONNREFUSED 127.0.0.1:5432\n    at TCPConnectWrap.afterConnect [as oncomplete]",
]
COMMANDS = ["find . -name '*.tmp' -mtime +7 -delete", "tar -czvf backup.tgz --exclude=.git .",
            "ps aux --sort=-%mem | head -n 5", "awk -F, 'NR>1 {s+=$3} END {print s}' data.csv",
            "git log --oneline --graph --all", "xargs -P 4 -n 1 curl -sO < urls.txt",
            "sed -i 's/\\r$//' script.sh", "lsof -i :3000", "du -sh * | sort -h", "chmod -R u+rwX,go-w project"]


def code_review(rng: random.Random, held_out: bool = True) -> str:
    s = _snippet(rng, held_out)
    return rng.choice([
        "Please review this as if it were a pull request: bugs, style, missing tests.\n\n{code}",
        "My teammate wrote this. Would you approve it? Be specific.\n\n{code}",
        "{code}\n\nanything wrong with this? it's going into production tomorrow",
        "Rate this {lang} code from 1 to 10 for readability and say what would raise the score.\n\n{code}",
    ]).format(code=_fence(s), lang=LANG_NAMES[s.lang])


def code_terse(rng: random.Random, held_out: bool = True) -> str:
    task = rng.choice(partition(TASKS_INF, held_out))
    return rng.choice(["{lang} how to {task}", "quick q: {task} in {lang}?", "{task} {lang} pls, short answer",
                       "best way to {task}?? using {lang}"]).format(lang=_language_for(task, rng).lower(), task=task)


def code_traceback(rng: random.Random, held_out: bool = True) -> str:
    return rng.choice(["what does this mean\n\n{tb}", "{tb}\n\nhelp, no idea where to start",
                       "Got this when deploying:\n\n{tb}\n\nWhat are the likely causes?"]).format(
        tb=rng.choice(TRACEBACKS))


def shell_explain(rng: random.Random, held_out: bool = True) -> str:
    return rng.choice(["What does this command do? `{c}`", "Explain each part of: {c}",
                       "Is this command safe to run on a server? {c}"]).format(c=rng.choice(COMMANDS))


CODE_FAMILIES = {"code_write": code_write, "code_app": code_app, "code_debug": code_debug, "code_error": code_error,
                 "code_explain": code_explain, "code_refactor": code_refactor, "code_tests": code_tests,
                 "shell": shell, "sql": sql, "data": data}
HELD_OUT_CODE_FAMILIES = {"code_review": code_review, "code_terse": code_terse, "code_traceback": code_traceback,
                          "shell_explain": shell_explain}


# ------------------------------------------------------------------ focused families
# Requests a set gets only through ``train-prompts --focus`` (speccompile/training/prompt_set.py),
# never drawn by the mixes: each fills a gap the heads' answers showed.
RECORDS = [  # (plural, singular, [(field, type as a user writes it)], id field, numeric, grouping keys)
    ("events", "event", [("event_id", "int"), ("user_id", "str"), ("kind", "str"), ("timestamp", "str, ISO 8601"),
                         ("duration_s", "float")], "event_id", ["duration_s"], ["user_id", "kind"]),
    ("books", "book", [("isbn", "str"), ("title", "str"), ("author", "str"), ("year", "int"),
                       ("ratings", "list of int")], "isbn", ["year"], ["author"]),
    ("readings", "reading", [("sensor_id", "str"), ("ts", "float"), ("value", "float"), ("unit", "str")],
     "sensor_id", ["value"], ["sensor_id", "unit"]),
    ("employees", "employee", [("name", "str"), ("department", "str"), ("salary", "float"), ("manager", "str or None")],
     "name", ["salary"], ["department"]),
    ("transactions", "transaction", [("tx_id", "str"), ("account", "str"), ("amount", "float"), ("currency", "str"),
                                     ("date", "str, YYYY-MM-DD")], "tx_id", ["amount"], ["account", "currency"]),
    ("students", "student", [("student_id", "int"), ("name", "str"),
                             ("grades", "dict mapping course name (str) to grade (float)")], "student_id",
     ["average grade"], ["name"]),
    ("tickets", "ticket", [("ticket_id", "int"), ("status", "str"), ("priority", "int"), ("assignee", "str or None"),
                           ("tags", "list of str")], "ticket_id", ["priority"], ["status", "assignee"]),
    ("products", "product", [("sku", "str"), ("name", "str"), ("price", "float"), ("stock", "int"),
                             ("categories", "list of str")], "sku", ["price", "stock"], ["categories"]),
    ("requests", "request", [("path", "str"), ("method", "str"), ("status", "int"), ("latency_ms", "float"),
                             ("client_ip", "str")], "path", ["latency_ms"], ["path", "status"]),
    ("shipments", "shipment", [("tracking", "str"), ("origin", "str"), ("destination", "str"), ("weight_kg", "float"),
                               ("delivered", "bool")], "tracking", ["weight_kg"], ["destination"]),
    ("reviews", "review", [("review_id", "int"), ("product", "str"), ("stars", "int"), ("text", "str"),
                           ("verified", "bool")], "review_id", ["stars"], ["product"]),
    ("tasks", "task", [("task_id", "str"), ("title", "str"), ("depends_on", "list of task ids (str)"),
                       ("estimate_h", "float")], "task_id", ["estimate_h"], ["task_id"]),
    ("flights", "flight", [("code", "str"), ("origin", "str"), ("dest", "str"), ("departure", "str, HH:MM"),
                           ("seats_left", "int")], "code", ["seats_left"], ["origin", "dest"]),
    ("invoices", "invoice", [("number", "str"), ("client", "str"), ("lines", "list of dicts with `description` (str), "
                             "`hours` (float) and `rate` (float)"), ("paid", "bool")], "number", ["amount due"],
     ["client"]),
    ("accounts", "account", [("username", "str"), ("email", "str"), ("created", "str, ISO 8601"),
                             ("logins", "list of ISO 8601 timestamps (str)"), ("plan", "str or None")], "username",
     ["login count"], ["plan"]),
]
RECORD_TASKS = [  # (function name, what it should do)
    ("{p}_by_{key_}", "group the {p} by `{key}` and return a dict that maps each `{key}` to a dict with the keys `count`, "
                      "`{num_}_sum` and `{num_}_max`"),
    ("top_{p}", "return the {k} {p} with the largest {num}, highest first, breaking ties by `{idf}`"),
    ("index_{p}", "return a dict that maps each `{idf}` to its {s}, raising ValueError on a duplicate `{idf}`"),
    ("validate_{p}", "check every {s} and return a list of error messages (one per problem, naming the `{idf}`) for "
                     "missing keys or values of the wrong type"),
    ("merge_{p}", "merge two lists of {p} by `{idf}`: when both have the same `{idf}`, keep the one from the second "
                  "list; return them sorted by `{idf}`"),
    ("partition_{p}", "split the {p} into two lists: those that pass a predicate given as an argument, and the rest"),
    ("{num_}_stats_by_{key_}", "compute, for each `{key}`, the mean and the median of {num}, skipping {p} where it is "
                               "missing, and return a dict of tuples"),
    ("parse_{p}_csv", "parse CSV text (a header line, then one {s} per line) into a list of {p}, converting each field "
                      "to its type"),
    ("outlier_{p}", "return the {p} whose {num} is more than {z} standard deviations from the mean"),
    ("paginate_{p}", "paginate the {p}: given `page` and `page_size`, return a dict with the keys `items`, `page`, "
                     "`pages` and `total`"),
    ("dedupe_{p}", "deduplicate the {p} by `{idf}`, keeping the first occurrence, and return the list together with "
                   "how many were removed"),
    ("nest_{p}", "build a nested dict that maps each `{key}` to a dict from `{idf}` to {s}"),
]
TYPING_STYLES = [
    "Include type hints and a short docstring.", "Use type hints from the typing module (List, Dict, Optional, Tuple) "
    "and a docstring.", "Use modern built-in generics in the type hints (list[...], dict[...]) and add a docstring.",
    "Define the {s} as a dataclass and type-annotate everything.",
    "Define the {s} shape as a TypedDict and annotate the function with it.",
    "Annotate all parameters and the return type, and include a few doctest examples.",
    "Write it as a small class with typed methods, with type hints everywhere.",
    "Use typing.NamedTuple for the result, and type hints throughout.",
]


def code_typed(rng: random.Random, held_out: bool = False) -> str:
    """A function specified in prose over records whose fields and types are listed, asked for
    with type hints (typing's generics, dataclasses, TypedDict). Why a family of its own:
    Qwen2.5-Coder writes annotations only when asked, and no other family asks, so 2.8M answer
    tokens of the shipped head's data held ` Dict` not once; on a typed request its EAGLE-3
    head then mispredicted every annotation with confidence (held-out records, every fifth,
    are types no training prompt names)."""
    p, s, fields, idf, nums, keys = rng.choice(partition(RECORDS, held_out))
    name, task = rng.choice(RECORD_TASKS)
    key, num = rng.choice(keys), rng.choice(nums)
    ctx = {"p": p, "s": s, "idf": idf, "key": key, "key_": key.replace(" ", "_"), "num_": num.replace(" ", "_"),
           "num": f"the {num}" if " " in num else f"`{num}`", "k": rng.choice([3, 5, 10]), "z": rng.choice([2, 2.5, 3])}
    listed = ", ".join(f"`{n}` ({t})" for n, t in fields[:-1]) + f" and `{fields[-1][0]}` ({fields[-1][1]})"
    call = f"{name.format(**ctx)}({p}{rng.choice(['', '', ', min_count=1', ', limit=None', ', strict=False'])})"
    head = rng.choice(["Write a Python function `{c}`.", "Implement `{c}` in Python.", "I need a Python function `{c}`."])
    return " ".join([head.format(c=call), f"Each element of `{p}` is a dict with the keys {listed}.",
                     f"The function should {task.format(**ctx)}.", rng.choice(TYPING_STYLES).format(s=s)])


FOCUS_FAMILIES = {"code_typed": code_typed}
