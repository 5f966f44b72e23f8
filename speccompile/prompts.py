"""Instruction prompts for self-distillation, written here (never taken from benchmark sets).

Why several families: a draft head learns what *this* target says, and it only learns
it for the kinds of requests it saw. The first heads were trained on explanations of
topics alone (topics x templates); on MT-bench first turns they accepted far less than
on held-out prompts of their own kind. Chat users also ask for stories and emails,
role-play, arithmetic, puzzles, extraction from a given text and code, and the target
answers each in its own register (lists, dialogue, equations, JSON, code blocks). So
each family below covers one such register, and ``instruction_prompts`` interleaves
them, so that any prefix of the list is balanced across them.

Numbers, names and passages are drawn from a seeded generator: the list is reproducible,
which keeps resumed distillation runs consistent with the data already on disk.
"""
from __future__ import annotations

import itertools
import random

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

PLACES = ["Lisbon", "Kyoto", "a small mountain village", "Iceland", "Marrakech", "New Orleans", "the Scottish "
          "Highlands", "Buenos Aires", "a Greek island", "Vancouver", "Cape Town", "Hanoi", "Prague", "Patagonia"]
NAMES = ["Alice", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kate", "Liam",
         "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara"]
COMPANIES = ["Northwind Labs", "Bluepeak Foods", "Orbital Freight", "Greenleaf Bank", "Kestrel Games",
             "Lumen Health", "Harbor Tools", "Atlas Textiles"]

WRITING = [
    "Write a travel blog post about a week in {place}, with local food and one unexpected moment.",
    "Draft a short, polite email to your manager asking to move a deadline by {n} days, and give a reason.",
    "Write a cover letter opening paragraph for a {job} position.",
    "Write a {n}-line poem about {t} that rhymes.",
    "Write a short story that begins with the sentence: '{name} found a key that opened nothing.'",
    "Write a speech for a {event}, about two minutes long.",
    "Write a product review of a {product}, mentioning two strengths and one weakness.",
    "Write a persuasive essay outline on why cities should invest in {t}.",
    "Write a thank-you note to {name}, who helped you move to {place}.",
    "Write the opening scene of a mystery novel set in {place}.",
    "Describe a sunrise in {place} using all five senses.",
    "Write a social media announcement for {company}'s new {product}.",
    "Edit this paragraph for grammar and clarity: 'me and {name} goes to the store yesterday, it were closed "
    "so we walks home and are tired.'",
    "Write a short fable with a moral, starring a {animal}.",
]
JOBS = ["data analyst", "nurse", "software engineer", "teacher", "marketing manager", "chef", "librarian"]
EVENTS = ["wedding toast", "graduation ceremony", "retirement party", "team kickoff meeting", "school reunion"]
PRODUCTS = ["smartwatch", "robot vacuum", "pair of running shoes", "coffee grinder", "e-reader", "camping tent"]
ANIMALS = ["fox", "tortoise", "crow", "elephant", "octopus", "rabbit", "wolf"]

ROLEPLAY = [
    "Pretend you are {persona}. {ask}",
    "Act as {persona} and answer in character: {ask}",
    "You are {persona}. Stay in character. {ask}",
]
PERSONAS = ["a pirate captain", "a medieval knight", "a detective in 1920s London", "a friendly robot from the "
            "future", "a grumpy chef", "a sports commentator", "a wise old wizard", "a startup founder pitching "
            "investors", "a museum guide", "a fitness coach", "Sherlock Holmes", "a space station commander",
            "a kindergarten teacher", "a stand-up comedian", "a travel agent", "a customer service agent"]
ASKS = ["Introduce yourself and describe your typical day.", "What advice would you give a newcomer?",
        "Tell me about the hardest challenge you ever faced.", "Convince me to join you on your next adventure.",
        "What do you think about smartphones?", "Describe your favorite meal and why you love it.",
        "A customer is unhappy with a late delivery. Respond to them.", "Explain why {t} matters to you.",
        "Give me three rules you live by.", "How would you spend a free weekend?"]

CODING = [
    "Write a {lang} function that {task}. Include a short example.",
    "Implement a function in {lang} that {task}, and explain its time complexity.",
    "Write code that {task}, in {lang}, with comments.",
    "What is a common bug when writing code that {task}? Show a fixed {lang} version.",
]
LANGS = ["Python", "JavaScript", "C++", "Java", "Go", "Rust", "C", "TypeScript", "SQL", "Bash"]
TASKS = ["reverses a linked list", "checks whether a string is a palindrome", "finds the longest common "
         "subsequence of two strings", "counts word frequencies in a text", "merges two sorted arrays",
         "computes the nth Fibonacci number iteratively", "validates an email address", "finds the median of "
         "two sorted arrays", "removes duplicates from a list while keeping order", "parses a CSV line",
         "implements a stack with push, pop and peek", "does a breadth-first search on a graph",
         "converts a Roman numeral to an integer", "finds the kth largest element", "checks if a binary tree "
         "is balanced", "rotates a matrix by 90 degrees", "computes the greatest common divisor",
         "groups anagrams together", "implements an LRU cache", "finds all primes below n"]

EXTRACTION = [
    "Extract every person's name, the company and the date from this text, as JSON:\n{passage}",
    "Read the following and list the key facts as bullet points:\n{passage}",
    "Summarize this text in one sentence, then list the numbers it mentions:\n{passage}",
    "From the text below, who did what, and when? Answer in a table.\n{passage}",
    "Classify the tone of this message (positive, negative or neutral) and explain why:\n{passage}",
]
PASSAGES = [
    "On {month} {day}, {name} joined {company} as head of research. {name2}, the CEO, said the team will grow "
    "to {n} people by the end of the year and open an office in {place}.",
    "Dear support team, my order #{n}{day} arrived on {month} {day} but the {product} was broken. "
    "I contacted {name} twice and nobody answered. I would like a refund of ${price}.",
    "{company} reported revenue of ${price} million in the third quarter, up {pct}% from last year. "
    "{name}, the CFO, credited strong sales of its {product} in {place}.",
    "The {place} marathon on {month} {day} was won by {name} in 2 hours {n} minutes; {name2} finished second, "
    "{pct} seconds behind.",
]
MONTHS = ["January", "March", "April", "June", "August", "September", "October", "December"]

MATH = [
    "A store sells {item} for ${a} each. {name} buys {b} of them and pays with a ${c} bill. How much change "
    "does {name} get?",
    "Solve for x: {a}x + {b} = {c}. Show your steps.",
    "A train travels {a} km in {b} hours. What is its average speed, and how long would {c} km take?",
    "What is {a}% of {c}? Explain how you computed it.",
    "The sides of a rectangle are {a} cm and {b} cm. What are its area and its perimeter?",
    "Find the sum of all integers from 1 to {c}.",
    "If a recipe for {b} people needs {a} eggs, how many eggs are needed for {c} people?",
    "A savings account pays {pct}% interest per year, compounded yearly. How much will ${c} be worth after "
    "{b} years?",
    "What is the probability of rolling a total of {d} with two fair six-sided dice?",
    "Solve the system: x + y = {c}, x - y = {a}.",
    "The vertices of a triangle are (0, 0), ({a}, 0) and (0, {b}). What is its area?",
    "Is {c} a prime number? Explain how you checked.",
]
ITEMS = ["notebooks", "apples", "tickets", "pens", "mugs", "plants"]

REASONING = [
    "{n1} is taller than {n2}, and {n2} is taller than {n3}. Who is the shortest? Explain.",
    "If it takes {a} machines {a} minutes to make {a} widgets, how long would {b} machines take to make {b} "
    "widgets?",
    "{n1} has {a} sisters. Each sister has {b} brothers. How many brothers does {n1} have, if {n1} is a boy?",
    "A bat and a ball cost ${a}.10 in total. The bat costs ${a} more than the ball. How much is the ball?",
    "You overtake the person in {ordinal} place in a race. What place are you in now?",
    "{n1} says: 'I always lie.' Is this statement true or false? Discuss.",
    "There are {a} red and {b} blue marbles in a bag. What is the chance of drawing two red marbles in a row "
    "without replacement?",
    "Today is {day_name}. What day of the week will it be in {c} days?",
    "Sort these numbers and explain any pattern you see: {seq}.",
    "What comes next in the sequence {seq}, and why?",
]
DAY_NAMES = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ORDINALS = ["second", "third", "fifth", "last"]


def _topic_prompts(rng: random.Random) -> list[str]:
    pairs = list(itertools.product(TEMPLATES, TOPICS))
    rng.shuffle(pairs)
    return [tpl.format(t=topic) for tpl, topic in pairs]


def _fill(rng: random.Random, template: str) -> str:
    """One template with its fields drawn from the generator (unused fields are ignored)."""
    a, b = rng.randint(2, 19), rng.randint(2, 12)
    start, step = rng.randint(1, 9), rng.randint(2, 7)
    names = rng.sample(NAMES, 3)
    fields = dict(
        t=rng.choice(TOPICS), place=rng.choice(PLACES), name=names[0], name2=names[1], n1=names[0], n2=names[1],
        n3=names[2], company=rng.choice(COMPANIES), job=rng.choice(JOBS), event=rng.choice(EVENTS),
        product=rng.choice(PRODUCTS), animal=rng.choice(ANIMALS), n=rng.randint(3, 40), a=a, b=b,
        c=rng.randint(20, 500), d=rng.randint(2, 12), pct=rng.randint(2, 15), price=rng.randint(12, 900),
        item=rng.choice(ITEMS), month=rng.choice(MONTHS), day=rng.randint(1, 28), day_name=rng.choice(DAY_NAMES),
        ordinal=rng.choice(ORDINALS), lang=rng.choice(LANGS), task=rng.choice(TASKS),
        persona=rng.choice(PERSONAS), seq=", ".join(str(start + step * i * (i + 1) // 2) for i in range(5)))
    fields["ask"] = rng.choice(ASKS).format(**fields)
    fields["passage"] = rng.choice(PASSAGES).format(**fields)
    return template.format(**fields)


def _drawn(rng: random.Random, templates: list[str], count: int) -> list[str]:
    out, seen = [], set()
    for _ in range(count * 4):
        p = _fill(rng, rng.choice(templates))
        if p not in seen:
            seen.add(p)
            out.append(p)
        if len(out) == count:
            break
    return out


def instruction_prompts(n: int, seed: int = 0) -> list[str]:
    """n distinct instruction prompts, interleaved across the families, reproducibly."""
    rng = random.Random(seed)
    topics = _topic_prompts(rng)  # two turns per round: MT-bench-like chat is stem and humanities twice over
    families = [topics[0::2], topics[1::2]] + [_drawn(rng, t, 1500) for t in (WRITING, ROLEPLAY, CODING,
                                                                                EXTRACTION, MATH, REASONING)]
    out, seen = [], set()
    for group in itertools.zip_longest(*families):
        for p in group:
            if p is not None and p not in seen:
                seen.add(p)
                out.append(p)
    if n > len(out):
        raise ValueError(f"at most {len(out)} distinct prompts are available, {n} asked")
    return out[:n]
