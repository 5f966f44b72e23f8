"""Grounded prompts: a request about a document the target wrote itself.

Why. A head trained on a coder model's chat traffic drafts poorly where the answer works
from text the user supplied: summaries of an article, answers over retrieved passages,
translations of a paragraph, facts pulled out of a memo. Those answers copy and condense
spans of their input, and the head only learns to attend to its context that way if it
sees such conversations. No corpus of documents is reachable from these machines, so the
target writes them: a slot of this kind first samples a document (an assistant answer to
a request such as "write a news article about ..."), then wraps it into the user turn
("Summarize this article in 3 bullet points:\\n\\n<the article>"). The head then trains on
the target's greedy answer to that turn, like any other prompt.

The subjects are fictional (names built from syllables, invented institutions), so the
documents carry names and figures the model cannot know and must copy from its input, as
real retrieved text would. Held-out slots draw from the fifth of every list the training
slots never use (``partition``) and wrap their documents in other phrasings.

A slot is a pure function of its random generator: ``grounded_slot`` returns the family,
the document request and the wrapper; the sampled document comes from the engine, which
depends only on the request and the slot's seed.
"""
from __future__ import annotations

import random
import re

from speccompile.training.prompts import LANGUAGES, MONTHS, partition

DOC = "{doc}"  # where the sampled document goes in a wrapper

SYLLABLES_A = ["Al", "Bren", "Cal", "Dor", "El", "Fen", "Gar", "Hal", "Ing", "Jor", "Kel", "Lin", "Mor", "Nor",
               "Ost", "Pel", "Quen", "Ros", "Sel", "Tor", "Ul", "Val", "Wen", "Yar", "Zel", "Ash", "Bel", "Cor"]
SYLLABLES_B = ["ford", "wick", "haven", "stead", "mouth", "dale", "by", "holm", "bury", "ton", "mere", "field",
               "gate", "ridge", "moor", "port", "well", "bridge", "combe", "thorpe"]
FIRST_NAMES = ["Mara", "Tomas", "Ines", "Olu", "Priya", "Henrik", "Leila", "Dmitri", "Aiko", "Rafael", "Sanna",
               "Kwame", "Elena", "Joost", "Nadia", "Callum", "Yusuf", "Bea", "Mateo", "Freya"]

# ---- what the documents are about (fictional places and institutions; never the evaluation prompts' subjects)
EVENTS = [
    "a council vote on a new public swimming pool", "a company's annual results and its plans for next year",
    "a school that moved to a four-day week", "a research team's finding about sleep and memory",
    "the first year of a night bus service", "a flood that closed the old town centre",
    "a hospital's new maternity wing", "the closure of a furniture factory", "a football club's promotion",
    "a museum exhibition of medieval maps", "a strike by airport baggage handlers", "a new housing estate",
    "the renovation of a concert hall", "a court ruling on noise from a wind farm", "a startup's funding round",
    "an archaeological find under a car park", "a wildfire in the hills above a town", "a mayoral election",
    "a new ferry route between two islands", "a summer drought and water rationing", "the repair of a road bridge",
    "a deposit-return scheme for bottles", "a university's tuition increase", "a record harvest of apples",
    "a cyberattack on a city's payment systems", "a supermarket chain's price freeze", "a zoo's new panda enclosure",
    "a teachers' pay agreement", "the reopening of a coal mine as a museum", "a ban on cars near schools",
    "a pharmacy shortage of a common medicine", "a local bakery winning a national award",
    "a landslide on a mountain railway", "a marathon with a record number of runners",
    "a merger of two regional banks", "a solar farm built on a former landfill", "a heatwave and hospital visits",
    "a new rule on short-term holiday rentals", "a children's hospital fundraising campaign",
    "a port expansion and its effect on fishing",
]
INSTITUTIONS = [
    "botanical garden", "railway museum", "lighthouse", "rowing club", "observatory", "seed bank",
    "community radio station", "ferry company", "mountain hut", "public orchard", "cheese cooperative",
    "chess federation", "wildlife rescue centre", "city marathon", "printing works", "bell foundry", "salt mine",
    "night market", "repair café", "youth orchestra", "hydroelectric dam", "public baths", "film archive",
    "beekeeping association", "canal trust", "lifeboat station", "puppet theatre", "farmers' market",
    "tram network", "folk music festival",
]
SITUATIONS = [
    "a landlord's notice to tenants about repairs to the heating", "a message to a neighbour about a parcel",
    "a hotel's rules for breakfast and checkout", "a weekend trip to the coast with friends",
    "how to use a shared washing machine in an apartment building", "a teacher's note to parents about a class trip",
    "a shop's policy for returns and refunds", "plans for a friend's surprise birthday party",
    "a gym's new opening hours over the holidays", "a job applicant thanking an interviewer",
    "a dentist's reminder about an appointment", "moving into a new flat and meeting the neighbours",
    "a power cut during a storm", "a train delay and a missed connection", "a recipe for a simple vegetable soup",
    "a volunteer clean-up day at a park", "a lost dog found near a school", "a family visit to a grandparent",
    "a restaurant's change of menu", "learning to drive at forty", "a library's new self-service machines",
    "a camping trip in the rain", "a neighbourhood garage sale", "a company's new policy on working from home",
    "a cooking class for beginners",
]
GENRES = [
    ("meeting minutes", "a project team's weekly meeting"), ("product announcement", "a new kitchen appliance"),
    ("customer complaint email", "a delayed furniture delivery"), ("job posting", "a warehouse supervisor"),
    ("event invitation", "a company's summer party"), ("incident report", "a minor fire in an office kitchen"),
    ("project status update", "the migration of a company's email system"),
    ("press release", "a charity's annual fundraising results"), ("memo", "new rules for booking meeting rooms"),
    ("letter from a school", "changes to the school bus timetable"), ("insurance claim", "water damage in a flat"),
    ("travel itinerary", "a three-day business trip"), ("safety notice", "construction work near a playground"),
    ("performance review", "a junior accountant's first year"), ("newsletter", "a residents' association"),
    ("contract summary", "renting a holiday cottage"), ("warranty terms", "a refurbished laptop"),
    ("invoice dispute email", "a catering order"), ("volunteer briefing", "a city half marathon"),
    ("grant application summary", "a community garden"),
]

# ---- wrappers: the user turn around the document ({doc}); held-out slots use the second list of each
SUMMARY = (["Summarize this article in {n} bullet points:\n\n{doc}",
            "Summarize the following news article in a short paragraph.\n\n{doc}",
            "Give me the key points of this article, with the numbers it mentions.\n\n{doc}",
            "{doc}\n\nSummarize the article above in {n} sentences.",
            "Write a two-sentence summary of this report for a newsletter:\n\n{doc}",
            "What happened here, who is affected, and what comes next? Summarize briefly.\n\n{doc}"],
           ["Can you boil this down to what matters?\n\n{doc}", "{doc}\n\ntl;dr?",
            "I don't have time to read this. What does it say?\n\n{doc}"])
RAG = (["Use only the passages below to answer: {q}\n\n{doc}",
        "Context:\n{doc}\n\nQuestion: {q}\nAnswer using only the context, and cite passage numbers like [2].",
        "Passages:\n{doc}\n\nBased on these passages, answer the question: {q}",
        "Here are some search results.\n\n{doc}\n\n{q} Answer from the search results only."],
       ["{doc}\n\nFrom the sources above: {q}", "I found these snippets:\n{doc}\nSo, {q}"])
QUESTIONS = ["When was {s} founded, and why?", "Who runs {s} today, and how is it paid for?",
             "What problems has {s} faced, and how were they dealt with?",
             "How many people use or visit {s}, according to the passages?",
             "What has changed at {s} in recent years?", "What do the passages say about the history of {s}?",
             "What does it cost to run {s}, and where does the money come from?",
             "Which people are named in connection with {s}, and what did each of them do?"]
TRANSLATE = (["Translate the following paragraph into {lang}:\n\n{doc}", "Please translate this text to {lang}.\n\n{doc}",
              "How would this read in {lang}?\n\n{doc}", "{doc}\n\nTranslate the text above into {lang}.",
              "Translate into {lang}, keeping the tone informal:\n\n{doc}"],
             ["Could you put this into {lang} for me?\n\n{doc}", "{lang} version of this, please:\n{doc}"])
EXTRACT = (["Extract every name, date and amount from this text as JSON:\n\n{doc}",
            "List the action items in the following, with owners and deadlines where given:\n\n{doc}",
            "Read this and answer: what is being asked of the reader, and by when?\n\n{doc}",
            "Turn the following into a table of the key facts (what, who, when, how much):\n\n{doc}",
            "Rewrite this in a more formal tone, keeping every detail:\n\n{doc}",
            "{doc}\n\nList the five most important facts in the text above."],
           ["What are the important details here? \n\n{doc}", "{doc}\n\nAny deadlines or numbers I should note?"])

GROUNDED_FAMILIES = ("doc_summary", "doc_rag", "doc_translate", "doc_extract")


def place(rng: random.Random) -> str:
    return rng.choice(SYLLABLES_A) + rng.choice(SYLLABLES_B)


def grounded_slot(family: str, rng: random.Random, held_out: bool = False) -> tuple[str, str]:
    """(the document request, the wrapper with ``{doc}``) of one slot of a grounded family."""
    pick = 1 if held_out else 0
    if family == "doc_summary":
        words = rng.choice([180, 220, 260, 300])
        request = (f"Write a news article of about {words} words reporting {rng.choice(partition(EVENTS, held_out))} "
                   f"in the town of {place(rng)}. Start with a headline, name the people involved, quote at least one "
                   "of them, and give concrete figures (amounts, dates, percentages). Write only the article.")
        return request, rng.choice(SUMMARY[pick]).replace("{n}", str(rng.randint(2, 5)))
    if family == "doc_rag":
        n = rng.randint(3, 4)
        subject = f"the {place(rng)} {rng.choice(partition(INSTITUTIONS, held_out))}"
        request = (f"Write {n} short passages about {subject}, as a search engine would retrieve them from different "
                   f"sources. Number them [1] to [{n}]; each only two or three sentences, with concrete names, dates "
                   "and numbers, and each on a different aspect (history, people, money, recent events). Write only "
                   "the passages.")
        q = rng.choice(QUESTIONS).format(s=subject)
        return request, rng.choice(RAG[pick]).replace("{q}", q)
    if family == "doc_translate":
        sentences = rng.randint(3, 6)
        request = (f"Write a paragraph of {sentences} sentences in simple everyday English about "
                   f"{rng.choice(partition(SITUATIONS, held_out))}. Use the names {rng.choice(FIRST_NAMES)} and "
                   f"{place(rng)} somewhere. Write only the paragraph.")
        return request, rng.choice(TRANSLATE[pick]).replace("{lang}", rng.choice(partition(LANGUAGES, held_out)))
    if family == "doc_extract":
        genre, about = rng.choice(partition(GENRES, held_out))
        # the details are given: asked to invent them, the target wrote templates ("Dear [Customer's Name]") 3 times in 4
        who = f"{rng.choice(FIRST_NAMES)} {rng.choice(SYLLABLES_A)}{rng.choice(['er', 'son', 'ley', 'ova', 'ić'])}"
        day, month, amount = rng.randint(1, 28), rng.choice(MONTHS), rng.choice([120, 480, 1250, 3900, 14500, 86000])
        request = (f"Write a realistic {genre} about {about}, of about {rng.choice([120, 160, 200])} words, from "
                   f"{who} of an organisation in {place(rng)}, dated {day} {month}, mentioning an amount of {amount} "
                   "and a deadline. Use these details and no placeholders in brackets. Write only the "
                   f"{genre}.")
        return request, rng.choice(EXTRACT[pick])
    raise ValueError(f"unknown grounded family {family!r}")


_PREAMBLE = re.compile(r"^(?:Sure|Certainly|Of course|Absolutely|Here(?:'s| is| are))\b[^\n]*(?::|!|\.)\s*$",
                       re.IGNORECASE)
_CODA = re.compile(r"^(?:I hope|Let me know|Feel free|Note:|(?:This|These) (?:article|paragraph|text|memo|passage)|"
                   r"\(?Word count|---+$)", re.IGNORECASE)


_PLACEHOLDER = re.compile(r"\[(?:insert|your|name|date|company|organi[sz]ation|city|address|phone|email|amount|"
                          r"recipient|title|position)\b[^\]]*\]", re.IGNORECASE)


def document_problem(doc: str) -> str | None:
    """Why a sampled document cannot ground a request, or None: a template with placeholders
    ("[Your Name]", "[insert date]") instead of the names and figures asked for, or too little text."""
    if _PLACEHOLDER.search(doc):
        return "document_placeholder"
    if len(doc.split()) < 40:
        return "document_too_short"
    return None


def complete_paragraphs(text: str) -> str:
    """A document cut by the length cap, back to its last complete paragraph (or passage): what
    comes before is still a whole document, and the request about it still makes sense. Empty
    when that would keep less than half of it."""
    cut = max(text.rfind("\n\n"), text.rfind("\n["))
    return text[:cut].rstrip() if cut >= len(text) // 2 else ""


def clean_document(text: str) -> str:
    """The document without the assistant's framing: a first line that announces it ("Sure! Here
    is the article:"), a closing line that comments on it ("I hope this helps", "Word count: 212"),
    and code fences around the whole."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```"):
        text = text.strip("`").split("\n", 1)[-1].strip()
    lines = text.split("\n")
    while lines and (not lines[0].strip() or _PREAMBLE.match(lines[0].strip())):
        lines.pop(0)
    while lines and (not lines[-1].strip() or _CODA.match(lines[-1].strip())):
        lines.pop()
    return "\n".join(lines).strip()
