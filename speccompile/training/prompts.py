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


# ------------------------------------------------------------------ prompt sets for coder targets
# ``instruction_prompts`` above stays as it is (the SmolLM2 heads' data resumes by its order).
# What follows serves speccompile/training/prompt_set.py: one prompt per draw, from families named
# here and in speccompile/training/prompts_code.py, with a held-out half of every list kept apart.


def partition(items: list, held_out: bool, every: int = 5) -> list:
    """Every ``every``-th item (from the first) for the held-out set, the others for training:
    the held-out prompts then ask about things no training prompt of that family mentions."""
    return items[::every] if held_out else [x for i, x in enumerate(items) if i % every]


SENTENCES = [
    "The meeting has been moved to Thursday afternoon because the client is travelling.",
    "Could you tell me where the nearest pharmacy is?", "I have been learning to play the piano for two years.",
    "Please keep your luggage with you at all times.", "The museum is free on the first Sunday of every month.",
    "We regret to inform you that your order has been delayed.", "My grandmother grew up in a small fishing village.",
    "Turn left at the bakery and walk straight for five minutes.", "The software update fixes several security issues.",
    "I'd like to book a table for four at eight o'clock.", "Rain is expected for most of the weekend.",
    "She finished the marathon despite a painful knee injury.", "Thank you for your patience while we investigate.",
    "The library will close early on public holidays.", "The bakery on the corner is hiring a part-time assistant.",
    "Do not leave the oven unattended while it is on.", "He apologized for forgetting her birthday.",
    "The train to the airport leaves every fifteen minutes.", "This recipe works just as well with oat milk.",
    "Children under twelve must be accompanied by an adult.",
]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Japanese", "Korean", "Russian", "Dutch",
             "Turkish", "Polish", "Swedish", "Hindi", "Indonesian", "Greek"]
ARTICLES = [
    "A new study of 2,400 office workers found that those who took a short walk every two hours reported less back "
    "pain and better concentration than those who stayed seated. The researchers asked half of the participants to "
    "walk for five minutes at regular intervals for eight weeks. Productivity, measured by completed tasks, did not "
    "fall, and several managers said meetings became shorter. The authors caution that the results rely on "
    "self-reported pain and that the study did not include remote workers.",
    "The town of Eldham will replace its diesel buses with electric ones over the next four years. The council "
    "approved a budget of 38 million, two thirds of it from a national grant. Charging stations will be built at the "
    "main depot first, and drivers will be trained in the spring. Critics point out that the buses cost twice as "
    "much as diesel models and that winter range is still uncertain. Supporters expect fuel and maintenance savings "
    "to cover the difference within twelve years.",
    "After three dry summers, farmers in the valley are switching from maize to sorghum, which needs about a third "
    "less water. Seed suppliers report that orders doubled this year. Agronomists say yields are lower but more "
    "stable, and that local mills will need new equipment to process the grain. Some farmers worry that buyers "
    "will not pay enough to make the switch worthwhile.",
    "The open-source project Quillmark released version 3.0 of its note-taking app, adding real-time collaboration "
    "and end-to-end encryption. The maintainers said the rewrite took eighteen months and was funded by donations "
    "from about 4,000 users. Older plugins will need to be updated because the extension API changed. The team "
    "plans to publish a migration guide and keep fixing security bugs in version 2 until next June.",
    "Volunteers counted 1,312 sea turtle nests on the island this season, the highest number in twenty years. "
    "Conservation groups credit a ban on beach lighting near nesting areas and patrols that discourage poaching. "
    "However, rising sand temperatures mean more females are hatching than males, a trend scientists will monitor "
    "with sensors buried at different depths.",
    "A mid-sized bakery chain cut its food waste by 40 percent in one year by forecasting demand for each shop and "
    "day of the week. Unsold bread is now sold at half price through an app in the last hour before closing, and "
    "what remains goes to food banks. The company says the forecasting tool paid for itself within five months.",
    "The regional hospital opened a night clinic for minor injuries, staffed by two nurses and a doctor on call. In "
    "its first month it treated 640 patients, and average waiting times in the emergency department fell from four "
    "hours to just under three. Staff unions welcomed the change but warned that recruiting night nurses remains "
    "difficult, and the clinic's funding is only guaranteed until the end of next year.",
    "A survey of 1,100 secondary school teachers found that most now use AI tools to prepare lessons, but fewer than "
    "one in five let students use them for homework. Teachers said the tools save about three hours a week, mainly "
    "on worksheets and quizzes. Many worried about cheating and about students losing the habit of writing drafts. "
    "The education ministry plans to publish guidelines in the autumn.",
    "City cyclists will get 22 kilometres of new protected bike lanes by 2026, the transport department announced. "
    "The first section, along the river, opens in May. Shop owners on two of the planned streets oppose the loss of "
    "parking spaces and have collected 3,000 signatures. The department says delivery zones will be kept and that "
    "similar projects elsewhere increased foot traffic for local shops.",
    "Researchers trained a small robot to sort recyclable waste using a camera and a suction gripper. In tests at a "
    "municipal plant it picked 38 items per minute with 94 percent accuracy, compared with about 30 items for a "
    "human worker. The team says the robot is meant to take over the dirtiest tasks rather than replace staff, and "
    "that its main weakness is crumpled or wet cardboard.",
]
QUESTIONS = [
    "Why do cats purr?", "How do noise-cancelling headphones work?", "Why is the ocean salty?",
    "What makes a good night's sleep?", "How do vaccines train the immune system?", "Why do leaves change color in "
    "autumn?", "How does a credit card payment actually go through?", "What is the difference between weather and "
    "climate?", "Why do we get jet lag?", "How do airplanes stay in the air?", "What causes inflation?",
    "How does GPS know where I am?", "Why do onions make you cry?", "How are rainbows formed?", "What is a mortgage "
    "and how does it work?", "Why do some people get motion sickness?", "How does a refrigerator keep things cold?",
    "What happens in the brain when we learn something new?", "Why is the sky dark at night if there are so many "
    "stars?", "How do bees make honey?", "What is the difference between a virus and a bacterium?",
    "How do solar panels turn sunlight into electricity?", "Why does bread go stale?", "How do elections work in a "
    "parliamentary system?",
]
GOALS = ["improve my sleep", "learn to cook on a budget", "save for a down payment", "get better at public speaking",
         "start running without getting injured", "read more books", "learn a new language as an adult",
         "keep a tidy home with little time", "prepare for a job interview", "reduce my screen time",
         "make friends in a new city", "negotiate a higher salary", "stay focused while working from home",
         "start a vegetable garden on a balcony", "plan a two-week trip on a small budget"]


def general_prompt(family: str, rng: random.Random, held_out: bool = False) -> str:
    """One prompt of a general-chat family. The families of ``instruction_prompts`` are
    drawn through the same templates; translation, summarization, questions and advice are
    new. Held-out families (``HELD_OUT_GENERAL_FAMILIES``) use other styles: constrained
    writing, hint-only tutoring, terse chat and comparisons."""
    topics = partition(TOPICS, held_out)
    if family == "topics":
        return rng.choice(TEMPLATES).format(t=rng.choice(topics))
    old = {"writing": WRITING, "roleplay": ROLEPLAY, "extraction": EXTRACTION, "math": MATH, "reasoning": REASONING}
    if family in old:
        return _fill(rng, rng.choice(old[family]))
    if family == "translation":
        return rng.choice(["Translate into {lang}: \"{s}\"", "How would you say this in {lang}? {s}",
                           "Translate this sentence to {lang} and explain any word choices that are not literal:\n{s}"]
                          ).format(lang=rng.choice(LANGUAGES), s=rng.choice(partition(SENTENCES, held_out)))
    if family == "summarization":
        return rng.choice(["Summarize this article in {n} bullet points:\n\n{a}", "Give me a one-paragraph summary "
                           "of the following, then list the numbers it mentions.\n\n{a}", "TL;DR this for a busy "
                           "manager:\n\n{a}", "What are the main arguments for and against in this text?\n\n{a}"]
                          ).format(n=rng.randint(2, 5), a=rng.choice(partition(ARTICLES, held_out)))
    if family == "qa":
        return rng.choice(["{q}", "{q} Please keep it short.", "{q} Explain it like I'm ten.",
                           "{q} Give me the scientific explanation."]).format(q=rng.choice(partition(QUESTIONS,
                                                                                                      held_out)))
    if family == "advice":
        return rng.choice(["How can I {g}?", "Give me a realistic four-week plan to {g}.",
                           "What mistakes should I avoid when I try to {g}?"]).format(
            g=rng.choice(partition(GOALS, held_out)))
    # held-out styles
    if family == "constrained":
        return rng.choice([
            "In exactly {n} sentences, explain {t}. Do not use the letter 'z'.",
            "Write a paragraph about {t} for a newsletter. Constraints: under {w} words, no jargon, end with a "
            "question to the reader.", "Describe {t} using only words a five-year-old knows, in a numbered list of "
            "{n} items."]).format(t=rng.choice(topics), n=rng.randint(3, 6), w=rng.choice([60, 80, 100, 120]))
    if family == "socratic":
        a, b, c = rng.randint(2, 15), rng.randint(2, 12), rng.randint(20, 300)
        problem = rng.choice([f"solve {a}x - {b} = {c}", f"find {a}% of {c}", f"a car covers {c} km in {b} hours; "
                              f"what is its speed?", f"how many ways can {b} people sit in a row?"])
        return rng.choice(["Don't give me the answer, only hints: {p}", "I want to learn, not copy. Guide me step "
                           "by step with questions: {p}"]).format(p=problem)
    if family == "terse_chat":
        return rng.choice(["eli5 {t}", "{t}?? explain pls", "tldr on {t}", "{t} in 2 lines"]).format(
            t=rng.choice(topics))
    if family == "versus":
        t1, t2 = rng.sample(topics, 2)
        return rng.choice(["{a} vs {b}: which is more useful to understand, and why?",
                           "What do {a} and {b} have in common, if anything?"]).format(a=t1, b=t2)
    raise ValueError(f"unknown prompt family {family!r}")


GENERAL_FAMILIES = ("topics", "writing", "roleplay", "extraction", "math", "reasoning", "translation",
                    "summarization", "qa", "advice")
HELD_OUT_GENERAL_FAMILIES = ("constrained", "socratic", "terse_chat", "versus")
