"""Prompt set for collecting target-model responses to train the DFlash drafter.

The drafter learns to imitate the target (SmolLM2-135M-Instruct) on its own responses, so what
matters is that the prompts cover the kinds of requests a small chat model sees. We have no data
hub, so every prompt is generated here from hand-written seed lists and templates, with a seeded
`random.Random` per category (never the global random state). The same seed always gives the same
prompts, and a held-out evaluation split is carved out so that acceptance can be measured on
prompts the drafter was not trained on.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from dflash_plugin.errors import DFlashError

CATEGORIES: tuple[str, ...] = (
    "chat",
    "writing",
    "coding",
    "math",
    "reasoning",
    "extraction",
    "stem",
    "humanities",
    "roleplay",
)

PROVENANCE = (
    "All prompts are synthetic: they are produced by dflash_plugin/train/prompts.py from seed "
    "lists (names, cities, products, tasks, concepts, topics, roles, ...) and sentence templates "
    "hand-written in that module for this project. No external dataset, web text or model output "
    "is used. Each category has its own generator driven by random.Random seeded from the build "
    "seed and the category name, so a given seed always reproduces the same prompts; prompts are "
    "deduplicated by normalized text (lowercase, collapsed whitespace) and an evaluation split is "
    "held out that shares no normalized text, and no number-masked template instance where "
    "possible, with the training split."
)


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    # Set by the real-source builder (dflash_plugin/train/sources): where the prompt came from,
    # and a second user message to ask on the target's own first answer.
    source: str = ""
    task: str = ""
    followup: str | None = None


# ---------------------------------------------------------------------------------------------
# Shared seed lists
# ---------------------------------------------------------------------------------------------

NAMES = (
    "Alice", "Bilal", "Carmen", "Dmitri", "Emeka", "Fatima", "George", "Hana", "Ivan", "Jun",
    "Kofi", "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Sami", "Tomoko",
    "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zara", "Aiden", "Beatriz", "Chen", "Daniela",
    "Elif", "Farid", "Grace", "Hugo", "Ingrid", "Jamal", "Keiko", "Liam", "Maya", "Noah",
)
SURNAMES = (
    "Smith", "Garcia", "Okafor", "Nguyen", "Kowalski", "Haddad", "Tanaka", "Rossi", "Patel",
    "Johansson", "Mensah", "Silva", "Müller", "Dubois", "Ivanova", "Kim", "Lopez", "Novak",
    "Brown", "Ahmed", "Costa", "Fischer", "Moreau", "Singh", "Walsh",
)
CITIES = (
    "Lisbon", "Nairobi", "Toronto", "Osaka", "Denver", "Krakow", "Lagos", "Melbourne", "Lyon",
    "Austin", "Seoul", "Cape Town", "Bogotá", "Dublin", "Hanoi", "Oslo", "Chennai", "Porto",
    "Vancouver", "Glasgow", "Santiago", "Cairo", "Munich", "Auckland", "Manila", "Boston",
)
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _date(rng: random.Random) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(2019, 2026)}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(7, 11)}:{rng.choice(('00', '15', '30', '45'))} {rng.choice(('AM', 'PM'))}"


def _distinct(rng: random.Random, pool: tuple[str, ...], k: int) -> list[str]:
    return rng.sample(pool, k)


# ---------------------------------------------------------------------------------------------
# chat: everyday questions and advice
# ---------------------------------------------------------------------------------------------

CHAT_GOALS = (
    "sleeping better", "saving money on groceries", "staying focused while working from home",
    "learning a new language", "keeping houseplants alive", "making new friends in a new city",
    "cooking healthy meals on a budget", "running my first 5K", "reducing screen time",
    "organizing a small closet", "preparing for a job interview", "getting along with roommates",
    "waking up earlier", "reading more books", "staying motivated at the gym",
    "planning a road trip", "decluttering my apartment", "dealing with stress before exams",
    "starting a vegetable garden", "packing light for a trip", "writing a good cover letter",
    "keeping a journal", "drinking more water", "hosting a dinner party", "training a new puppy",
    "negotiating a salary", "studying for a math test", "taking better phone photos",
    "keeping my inbox under control", "cutting down on sugar", "learning to play guitar",
    "staying safe while hiking alone", "meal prepping for the week", "speaking up in meetings",
    "building a morning routine", "paying off a credit card", "choosing a first car",
    "making small talk", "keeping a long-distance friendship going", "cleaning a kitchen quickly",
    "being more patient with kids", "moving to a new apartment", "learning to swim as an adult",
    "remembering people's names", "getting started with meditation", "shopping for a laptop",
    "staying warm in winter without a big heating bill", "writing thank-you notes",
    "planning a birthday party", "improving my handwriting",
)
CHAT_QUESTIONS = (
    "How do I get a stain out of a white shirt?", "How often should I water a cactus?",
    "Is it better to rent or buy a home?", "What should I pack for a weekend camping trip?",
    "How long should I boil an egg for a soft yolk?", "What's a good gift for a coworker?",
    "How do I politely decline an invitation?", "What can I cook with rice, eggs and spinach?",
    "How do I start a conversation with someone at a party?", "Why does my bread come out dense?",
    "What's a fun thing to do on a rainy afternoon?", "How do I fix a squeaky door?",
    "How can I tell if milk has gone bad?", "What should I look for when adopting a cat?",
    "How do I keep my phone battery healthy?", "What are some good board games for four people?",
    "How do I apologize to a friend I hurt?", "Should I stretch before or after running?",
    "How do I make my small bedroom feel bigger?", "What's a simple way to start budgeting?",
    "How do I choose a good watermelon?", "What are easy plants for a dark room?",
    "How can I stop procrastinating?", "What do I need to start baking bread at home?",
    "How do I keep cut flowers fresh longer?", "How can I make my commute less boring?",
    "What should I do if I lock myself out of my house?", "How do I remove rust from a bike chain?",
    "What is a good way to memorize a speech?", "How do I say no to extra work without guilt?",
)
CHAT_PAIRS = (
    ("baking soda", "baking powder"), ("a cold", "the flu"), ("a debit card", "a credit card"),
    ("weather", "climate"), ("a latte", "a cappuccino"), ("jogging", "running"),
    ("a crocodile", "an alligator"), ("a lake", "a pond"), ("affect", "effect"),
    ("a virus", "bacteria"), ("a hurricane", "a tornado"), ("jam", "jelly"),
    ("a rabbit", "a hare"), ("a savings account", "a checking account"), ("sunrise", "dawn"),
    ("a violin", "a viola"), ("a town", "a city"), ("a turtle", "a tortoise"),
    ("soup", "stew"), ("a hobby", "a passion"), ("a bee", "a wasp"), ("ale", "lager"),
)
CHAT_OPENERS = ("", "Quick question: ", "Hi! ", "I was wondering, ", "Hey, ", "Can you help? ")
CHAT_CLOSERS = (
    "", " Please keep it short.", " Explain it like I'm a beginner.",
    " A few bullet points would be great.", " Thanks!", " What would you recommend?",
)


def _chat(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        core = f"Can you give me {rng.randint(3, 7)} tips for {rng.choice(CHAT_GOALS)}?"
    elif kind == 1:
        core = f"I want to get better at {rng.choice(CHAT_GOALS)}. Where should I start?"
    elif kind == 2:
        core = rng.choice(CHAT_QUESTIONS)
    else:
        a, b = rng.choice(CHAT_PAIRS)
        core = f"What's the difference between {a} and {b}?"
    # Openers and closers vary register the way real chat messages do.
    opener = rng.choice(CHAT_OPENERS)
    if opener.endswith((", ", ": ")) and not core.startswith("I "):
        core = core[0].lower() + core[1:]
    return opener + core + rng.choice(CHAT_CLOSERS)


# ---------------------------------------------------------------------------------------------
# writing: forms x topics x constraints
# ---------------------------------------------------------------------------------------------

WRITING_FORMS = (
    "a short poem", "a haiku", "a limerick", "a short story", "a persuasive paragraph",
    "a formal email", "a friendly email", "a product description", "a blog post introduction",
    "a diary entry", "a short speech", "a news headline and first paragraph",
    "a letter to the editor", "a motivational quote with a short explanation", "a song chorus",
    "a fable with a moral", "a two-sentence horror story", "a restaurant review",
    "a social media post", "a thank-you note", "an opening paragraph for a novel",
    "a short dialogue between two characters",
)
WRITING_TOPICS = (
    "the first snow of winter", "a lost umbrella", "a robot learning to paint",
    "a reusable water bottle", "moving to a new city", "a lighthouse keeper",
    "the smell of fresh coffee", "a community garden", "a noise-cancelling headphone",
    "the last day of summer", "a cat who runs a bakery", "public libraries", "a mountain sunrise",
    "a forgotten birthday", "an old bicycle", "the ocean at night", "a new coffee shop opening",
    "learning to ride a bike", "a city without cars", "friendship between neighbors",
    "a delayed train", "a handmade wooden chair", "the importance of recycling",
    "a thunderstorm", "an astronaut's first day in space", "a grandmother's recipe book",
    "a school science fair", "a smart alarm clock", "autumn leaves", "a lost dog finding home",
    "a rainy Sunday morning", "a volunteer firefighter", "the end of a long war",
    "a small fishing village", "a time traveler's regret", "a bakery's first customer",
    "a power outage", "a solar-powered backpack", "a chess tournament", "a family road trip",
    "a desert at noon", "a street musician", "a dragon who is afraid of fire",
    "the first day at a new job", "a quiet forest", "an overdue library book",
    "a wedding in the rain", "a pair of hiking boots", "a lonely satellite", "spring cleaning",
    "a marathon finish line", "an abandoned amusement park", "kindness to strangers",
    "a talking parrot", "a village festival", "a hot air balloon ride", "a broken phone screen",
    "the night before an exam", "a winter market", "a message in a bottle",
)
WRITING_CONSTRAINTS = (
    "", "Keep it under 100 words.", "Use a cheerful tone.", "Make it a little sad.",
    "Write it for children.", "Use simple, clear language.", "Make it funny.",
    "Include a surprising ending.", "Use vivid sensory details.", "Write in the first person.",
    "Keep a calm, gentle tone.",
)
WRITING_VERBS = ("Write", "Please write", "Compose", "Draft", "Could you write")


def _writing(rng: random.Random) -> str:
    form, topic = rng.choice(WRITING_FORMS), rng.choice(WRITING_TOPICS)
    verb = rng.choice(WRITING_VERBS)
    end = "?" if verb.startswith("Could") else "."
    return f"{verb} {form} about {topic}{end} {rng.choice(WRITING_CONSTRAINTS)}"


# ---------------------------------------------------------------------------------------------
# coding: tasks x languages x styles
# ---------------------------------------------------------------------------------------------

CODING_TASKS = (
    "reverses a string", "checks whether a number is prime", "returns the nth Fibonacci number",
    "counts the vowels in a string", "finds the largest element in a list",
    "removes duplicates from a list while keeping order", "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "merges two sorted lists into one sorted list",
    "computes the factorial of a number", "flattens a nested list",
    "counts word frequencies in a text",
    "checks whether two strings are anagrams", "returns the second largest number in a list",
    "computes the greatest common divisor of two integers", "converts a decimal number to binary",
    "validates a simple email address", "splits a list into chunks of a given size",
    "rotates a list by k positions", "finds the intersection of two lists",
    "capitalizes the first letter of every word", "sums the digits of an integer",
    "checks whether parentheses in a string are balanced",
    "performs binary search on a sorted list",
    "returns all prime numbers below n", "computes the average of a list of numbers",
    "finds the longest word in a sentence", "counts how many times a character appears",
    "transposes a matrix", "checks whether a year is a leap year",
    "converts a Roman numeral to an integer",
    "converts an integer to a Roman numeral", "finds the missing number in a list from 1 to n",
    "returns the running total of a list", "groups words by their first letter",
    "removes all whitespace from a string", "finds the mode of a list of numbers",
    "checks whether a list is sorted", "implements bubble sort", "implements insertion sort",
    "computes the median of a list", "generates all permutations of a string",
    "returns the indices of two numbers that add up to a target",
    "truncates a string to n characters with an ellipsis",
    "counts the lines in a text file", "parses a date string in YYYY-MM-DD format",
    "computes compound interest", "converts a string to snake_case",
    "converts snake_case to camelCase",
    "finds the longest common prefix of a list of strings",
    "checks whether a number is a perfect square",
    "returns the first non-repeating character in a string",
    "computes the dot product of two vectors",
    "shuffles a list without using a library shuffle", "formats a number with thousands separators",
    "finds all pairs in a list that sum to zero",
    "computes the Levenshtein distance between two strings",
    "implements a simple stack with push and pop",
    "reads a CSV file and returns the rows as dictionaries",
    "checks whether a number is an Armstrong number", "returns the cumulative maximum of a list",
)
CODING_LANGUAGES = (
    "Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C++", "Ruby",
)
CODING_STYLES = (
    "", "Include a docstring or comment explaining it.", "Add type annotations.",
    "Include two example calls.", "Explain the time complexity afterwards.",
    "Handle invalid input gracefully.", "Keep it short and readable.", "Add a few simple tests.",
    "Avoid using built-in helpers for the core logic.",
)
CODING_CONCEPT_PAIRS = (
    ("a list", "a tuple"), ("a process", "a thread"), ("recursion", "iteration"),
    ("a shallow copy", "a deep copy"), ("a class", "an object"), ("an array", "a linked list"),
    ("a stack", "a queue"), ("compiled", "interpreted languages"), ("== ", "is in Python"),
    ("a hash map", "a binary search tree"), ("TCP", "UDP"), ("SQL", "NoSQL databases"),
    ("synchronous", "asynchronous code"), ("git merge", "git rebase"),
    ("unit tests", "integration tests"),
    ("a function", "a method"), ("static typing", "dynamic typing"), ("a library", "a framework"),
)


def _coding(rng: random.Random) -> str:
    task, lang = rng.choice(CODING_TASKS), rng.choice(CODING_LANGUAGES)
    style = rng.choice(CODING_STYLES)
    kind = rng.randrange(5)
    if kind <= 2:
        return f"Write a {lang} function that {task}. {style}"
    if kind == 3:
        return f"How would you write {lang} code that {task}? Show it and explain it. {style}"
    a, b = rng.choice(CODING_CONCEPT_PAIRS)
    detail = rng.choice(("Give a short example.", "Keep it brief.", "When should I use each?", ""))
    return f"What is the difference between {a.strip()} and {b}? {detail}"


# ---------------------------------------------------------------------------------------------
# math: word problems with random numbers and names
# ---------------------------------------------------------------------------------------------

MATH_ITEMS = (
    ("notebook", "notebooks"), ("apple", "apples"), ("pen", "pens"), ("muffin", "muffins"),
    ("ticket", "tickets"), ("bottle of juice", "bottles of juice"),
    ("pack of stickers", "packs of stickers"),
    ("sandwich", "sandwiches"), ("book", "books"), ("plant pot", "plant pots"),
)
MATH_SHAREABLES = (
    "marbles", "cookies", "stickers", "candies", "trading cards", "pencils", "seashells",
)
MATH_VEHICLES = ("car", "train", "bus", "cyclist", "truck", "ferry", "motorbike")
MATH_PRODUCTS = (
    "jacket", "lamp", "bicycle", "pair of shoes", "backpack", "desk chair", "tablet", "kettle",
)
MATH_PLACES = ("garden", "room", "playground", "parking lot", "swimming pool", "field")
MATH_ASKS = ("", " Show your work.", " Explain each step.", " Give the final answer clearly.")


def _math_money(rng: random.Random) -> str:
    name = rng.choice(NAMES)
    item, items = rng.choice(MATH_ITEMS)
    n, cents = rng.randint(2, 9), rng.randrange(50, 1200, 25)
    bill = next(b for b in (10, 20, 50, 100, 200) if b * 100 > n * cents)
    if rng.random() < 0.5:
        return (f"{name} buys {n} {items} at ${cents / 100:.2f} each and pays with a ${bill} bill. "
                f"How much change should {name} get back?")
    price, pct = rng.randrange(20, 400, 5), rng.choice((10, 15, 20, 25, 30, 40, 50))
    return (f"A {rng.choice(MATH_PRODUCTS)} costs ${price}. It is on sale for {pct}% off. "
            "What is the sale price?")


def _math_rates(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        speed, hours = rng.randint(8, 120), rng.randint(2, 9)
        return (f"A {rng.choice(MATH_VEHICLES)} travels {speed * hours} kilometers in {hours} "
                "hours. "
                "What is its average speed in kilometers per hour?")
    if kind == 1:
        name, pages, total = rng.choice(NAMES), rng.randint(8, 60), rng.randrange(120, 900, 10)
        return (f"{name} reads {pages} pages a day. How many days will it take to finish a "
                f"{total}-page book?")
    principal, rate, years = rng.randrange(500, 20000, 250), rng.randint(2, 9), rng.randint(2, 10)
    return (f"If you invest ${principal} at {rate}% simple interest per year, how much interest "
            f"will you earn after {years} years?")


def _math_algebra(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        a, x, b = rng.randint(2, 12), rng.randint(-10, 20), rng.randint(-30, 30)
        sign = "+" if b >= 0 else "-"
        return f"Solve for x: {a}x {sign} {abs(b)} = {a * x + b}."
    if kind == 1:
        older, younger = _distinct(rng, NAMES, 2)
        gap, age, later = rng.randint(2, 15), rng.randint(3, 40), rng.randint(2, 10)
        total = 2 * age + gap + 2 * later
        return (f"{older} is {gap} years older than {younger}. In {later} years, the sum of their "
                f"ages will be {total}. How old is {younger} now?")
    nums = [rng.randint(1, 100) for _ in range(rng.randint(4, 7))]
    return f"What is the mean and the median of these numbers: {', '.join(map(str, nums))}?"


def _math_shapes_and_parts(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        w, l = rng.randint(3, 60), rng.randint(3, 80)
        return (f"A rectangular {rng.choice(MATH_PLACES)} is {w} meters wide and {l} meters long. "
                "What are its area and its perimeter?")
    if kind == 1:
        name, total, k = rng.choice(NAMES), rng.randint(20, 300), rng.randint(3, 12)
        return (f"{name} has {total} {rng.choice(MATH_SHAREABLES)} and shares them equally among "
                f"{k} friends. How many does each friend get, and how many are left over?")
    # Fractions chosen so the eaten part is less than one whole pizza.
    while True:
        f1 = Fraction(rng.randint(1, 5), rng.choice((3, 4, 6, 8, 10, 12)))
        f2 = Fraction(rng.randint(1, 5), rng.choice((3, 4, 6, 8, 10, 12)))
        if f1 + f2 < 1:
            break
    a, b = _distinct(rng, NAMES, 2)
    return f"{a} ate {f1} of a pizza and {b} ate {f2} of it. What fraction of the pizza is left?"


def _math(rng: random.Random) -> str:
    makers = (_math_money, _math_rates, _math_algebra, _math_shapes_and_parts)
    return rng.choice(makers)(rng) + rng.choice(MATH_ASKS)


# ---------------------------------------------------------------------------------------------
# reasoning: syllogisms, orderings, sequences, puzzles with random entities
# ---------------------------------------------------------------------------------------------

NONSENSE_KINDS = (
    "blorps", "zindles", "quaffs", "trelks", "morvits", "plonks", "skerms", "vadlings", "grooms",
    "frabbits", "nelps", "dorvens", "wumbles", "snarfs", "tegrins", "yullows", "kibbets", "lorns",
    "pindrels", "havrets", "mizzles", "obrants", "crests", "fennicks",
)
ORDER_RELATIONS = (
    ("taller than", "tallest", "shortest"), ("older than", "oldest", "youngest"),
    ("faster than", "fastest", "slowest"), ("heavier than", "heaviest", "lightest"),
    ("richer than", "richest", "poorest"),
)
COMPARE_OPTIONS = (
    ("a bicycle", "a bus", "commuting 5 kilometers in a city"),
    ("a tablet", "a laptop", "a college student"),
    ("renting", "buying", "someone who moves every two years"),
    ("email", "a phone call", "resolving a billing problem"),
    ("a paper map", "a phone app", "hiking in the mountains"),
    ("a dog", "a cat", "a person who works long hours"),
    ("trains", "planes", "a 400-kilometer trip"),
    ("a gas stove", "an induction cooktop", "a small apartment"),
    ("flashcards", "practice tests", "preparing for a history exam"),
    ("a spreadsheet", "a notebook", "tracking a budget"),
    ("a group project", "a solo project", "learning a new skill"),
    ("walking", "swimming", "exercise for beginners"),
)


def _reasoning_logic(rng: random.Random) -> str:
    a, b, c = _distinct(rng, NONSENSE_KINDS, 3)
    x = rng.choice(NAMES)
    kind = rng.randrange(3)
    if kind == 0:
        return (f"All {a} are {b}. All {b} are {c}. Are all {a} necessarily {c}? "
                "Explain your reasoning.")
    if kind == 1:
        return f"All {a} are {b}. Some {b} are {c}. Does it follow that some {a} are {c}? Explain."
    return f"No {a} are {b}. {x} is one of the {b}. Can {x} be one of the {a}? Explain your answer."


def _reasoning_order(rng: random.Random) -> str:
    p1, p2, p3, p4 = _distinct(rng, NAMES, 4)
    rel, top, bottom = rng.choice(ORDER_RELATIONS)
    facts = [f"{p1} is {rel} {p2}.", f"{p3} is {rel} {p1}.", f"{p2} is {rel} {p4}."]
    rng.shuffle(facts)  # order of clues should not give the answer away
    return f"{' '.join(facts)} Who is the {rng.choice((top, bottom))}? Explain step by step."


def _reasoning_numbers(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        start, step = rng.randint(1, 20), rng.randint(2, 9)
        geometric = rng.random() < 0.4
        seq = [start * step**i if geometric else start + step * i for i in range(5)]
        return (f"What number comes next in the sequence {', '.join(map(str, seq))}? "
                "Explain the pattern.")
    if kind == 1:
        return (f"If today is {rng.choice(DAYS)}, what day of the week will it be in "
                f"{rng.randint(3, 400)} days? Explain.")
    m, n = rng.randint(3, 9), rng.randint(10, 200)
    return (f"If it takes {m} machines {m} minutes to make {m} widgets, how long would it take "
            f"{n} machines to make {n} widgets? Explain your reasoning.")


def _reasoning_puzzle(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        a, b, c = _distinct(rng, NAMES, 3)
        return (f"{a} says that {b} is lying. {b} says that {c} is lying. {c} says that both {a} "
                f"and {b} are lying. Who is telling the truth?")
    if kind == 1:
        n = rng.randint(4, 40)
        return (f"At a meeting of {n} people, everyone shakes hands with everyone else exactly "
                "once. How many handshakes are there?")
    x, y, use = rng.choice(COMPARE_OPTIONS)
    return f"Compare {x} and {y} for {use}. Weigh the pros and cons and give a recommendation."


def _reasoning(rng: random.Random) -> str:
    makers = (_reasoning_logic, _reasoning_order, _reasoning_numbers, _reasoning_puzzle)
    return rng.choice(makers)(rng)


# ---------------------------------------------------------------------------------------------
# extraction: generated paragraph + "extract as JSON"
# ---------------------------------------------------------------------------------------------

EXTRACTION_PRODUCTS = (
    ("wireless mouse", "wireless mice"), ("ceramic mug", "ceramic mugs"), ("yoga mat", "yoga mats"),
    ("desk lamp", "desk lamps"), ("phone charger", "phone chargers"),
    ("water filter", "water filters"),
    ("notebook set", "notebook sets"), ("Bluetooth speaker", "Bluetooth speakers"),
    ("rain jacket", "rain jackets"), ("coffee grinder", "coffee grinders"),
    ("board game", "board games"),
)
COMPANIES = (
    "Brightpath Labs", "Northwind Foods", "Bluefin Logistics", "Cedar & Co.", "Helio Energy",
    "Maple Analytics", "Orbit Health", "Pinecrest Bank", "Quarry Studios", "Riverstone Tech",
)
JOBS = (
    "data analyst", "nurse", "graphic designer", "backend developer", "accountant", "teacher",
    "sales manager", "electrician", "marketing assistant", "lab technician",
)
EVENTS = (
    "jazz festival", "book fair", "science fair", "food market", "charity run", "film night",
    "craft fair",
)
MEETING_TOPICS = (
    "the quarterly budget", "a new product launch", "hiring plans", "the office move",
    "a customer complaint",
)
EXTRACT_LEADS = ("Extract", "Pull out", "Identify")


def _person(rng: random.Random) -> str:
    return f"{rng.choice(NAMES)} {rng.choice(SURNAMES)}"


def _extraction_text(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(4)
    if kind == 0:
        qty, price = rng.randint(1, 12), rng.randrange(499, 15000, 100) / 100
        product = rng.choice(EXTRACTION_PRODUCTS)[qty > 1]
        return (f"On {_date(rng)}, {_person(rng)} from {rng.choice(CITIES)} ordered {qty} "
                f"{product} at ${price:.2f} each.",
                "the customer name, city, order date, product, quantity and unit price")
    if kind == 1:
        a, b = _person(rng), _person(rng)
        return (f"{a} and {b} met in {rng.choice(CITIES)} on {_date(rng)} at {_time(rng)} to "
                f"discuss {rng.choice(MEETING_TOPICS)}. They agreed to meet again in "
                f"{rng.randint(2, 6)} weeks.",
                "the attendees, date, time, location and topic")
    if kind == 2:
        contact, company = _person(rng), rng.choice(COMPANIES)
        email = contact.split()[0].lower() + "@" + company.split()[0].lower().strip(".&") + ".com"
        return (f"{company} is hiring a {rng.choice(JOBS)} in {rng.choice(CITIES)}. The salary is "
                f"${rng.randrange(32000, 150000, 500):,} per year and applications close on "
                f"{_date(rng)}. Contact {contact} at {email}.",
                "the company, job title, city, salary, deadline and contact email")
    return (f"The {rng.choice(CITIES)} {rng.choice(EVENTS)} will take place on {_date(rng)}. "
            f"Tickets cost ${rng.randint(5, 90)} and doors open at {_time(rng)}. "
            f"The organizer is {_person(rng)}.",
            "the event name, date, ticket price, opening time and organizer")


def _extraction(rng: random.Random) -> str:
    text, fields = _extraction_text(rng)
    text_first = rng.random() < 0.5  # instruction before or after the text, both are common
    where = "above" if text_first else "below"
    ask = rng.choice((
        f"{rng.choice(EXTRACT_LEADS)} {fields} from the text {where} as JSON.",
        f"Read the text and return a JSON object with {fields}.",
        f"From this text, {rng.choice(EXTRACT_LEADS).lower()} {fields}. Answer only with JSON.",
    ))
    return f"Text: {text}\n\n{ask}" if text_first else f"{ask}\n\nText: {text}"


# ---------------------------------------------------------------------------------------------
# stem: concepts x audiences x templates
# ---------------------------------------------------------------------------------------------

STEM_CONCEPTS = (
    # physics
    "gravity", "inertia", "friction", "momentum", "kinetic energy", "potential energy",
    "electric current", "magnetism", "electromagnetic waves", "the Doppler effect", "refraction",
    "sound waves", "entropy", "heat conduction", "buoyancy", "air pressure", "nuclear fission",
    "special relativity", "quantum tunneling", "black holes", "the speed of light", "resonance",
    # chemistry
    "atoms and molecules", "chemical bonds", "the periodic table", "acids and bases", "pH",
    "oxidation", "catalysts", "chemical equilibrium", "isotopes", "polymers", "combustion",
    "solutions and solubility", "states of matter", "electrolysis", "the mole concept",
    # biology
    "photosynthesis", "cellular respiration", "DNA", "genes and heredity", "natural selection",
    "the immune system", "vaccines", "enzymes", "mitosis", "the nervous system", "ecosystems",
    "the water cycle", "the carbon cycle", "antibiotic resistance", "protein synthesis",
    "the circulatory system", "symbiosis", "homeostasis", "viruses",
    # computer science and math
    "algorithms", "recursion", "binary numbers", "encryption", "hash functions", "the internet",
    "machine learning", "neural networks", "compilers", "operating systems", "databases",
    "Big O notation", "sorting algorithms", "computer memory", "public key cryptography",
    "probability", "exponential growth", "prime numbers", "the Pythagorean theorem", "derivatives",
    "integrals", "statistics and averages", "vectors", "logarithms",
    # earth and space
    "plate tectonics", "the greenhouse effect", "seasons on Earth", "tides",
    "the phases of the Moon",
)
STEM_AUDIENCES = (
    "a ten-year-old", "a high school student", "a first-year university student",
    "someone with no science background", "a curious grandparent", "a software engineer",
    "an artist", "a new teacher", "a middle school class", "a busy business person",
)
STEM_TEMPLATES = (
    "Explain {c} to {a}.",
    "How would you explain {c} to {a}? Use an everyday analogy.",
    "Give a short explanation of {c} suitable for {a}.",
    "Explain {c} to {a} in three short paragraphs.",
    "Give {a} a simple example that illustrates {c}.",
    "Why should people care about {c} in everyday life? Explain it for {a}.",
    "What are common misconceptions about {c}? Answer for {a}.",
)


def _stem(rng: random.Random) -> str:
    c, a = rng.choice(STEM_CONCEPTS), rng.choice(STEM_AUDIENCES)
    return rng.choice(STEM_TEMPLATES).format(c=c, a=a)


# ---------------------------------------------------------------------------------------------
# humanities: history, philosophy, literature, art
# ---------------------------------------------------------------------------------------------

HISTORY_EVENTS = (
    "the fall of the Western Roman Empire", "the French Revolution", "the Industrial Revolution",
    "the printing press", "the Renaissance", "the American Civil War", "World War I",
    "the Great Depression", "the Cold War", "the fall of the Berlin Wall", "the Silk Road",
    "the Black Death", "the Meiji Restoration", "the Protestant Reformation",
    "the building of the pyramids of Giza", "the Mongol Empire",
    "the abolition of slavery in Britain",
    "Indian independence in 1947", "the moon landing", "the invention of writing in Mesopotamia",
    "the Magna Carta", "the Age of Exploration", "the Haitian Revolution", "the Ottoman Empire",
    "the women's suffrage movement", "the civil rights movement", "the Russian Revolution",
    "the decolonization of Africa", "the Viking Age", "ancient Athenian democracy",
)
PHILOSOPHY_IDEAS = (
    ("Plato", "the allegory of the cave"), ("Aristotle", "virtue ethics"),
    ("Descartes", "'I think, therefore I am'"),
    ("Kant", "the categorical imperative"), ("John Stuart Mill", "utilitarianism"),
    ("Confucius", "filial piety"),
    ("Laozi", "the idea of wu wei"), ("Socrates", "the Socratic method"),
    ("Hume", "the problem of induction"),
    ("Nietzsche", "the idea of the Übermensch"), ("Simone de Beauvoir", "existentialist ethics"),
    ("Epicurus", "the pursuit of tranquil pleasure"), ("Marcus Aurelius", "Stoicism"),
    ("Hobbes", "the social contract"),
    ("Locke", "natural rights"), ("Rousseau", "the general will"), ("Sartre", "radical freedom"),
    ("Hannah Arendt", "the banality of evil"), ("Buddha", "the Four Noble Truths"),
    ("Spinoza", "the idea of God as nature"),
)
LITERARY_WORKS = (
    ("Pride and Prejudice", "Jane Austen"), ("1984", "George Orwell"),
    ("Hamlet", "William Shakespeare"),
    ("Don Quixote", "Miguel de Cervantes"), ("Things Fall Apart", "Chinua Achebe"),
    ("One Hundred Years of Solitude", "Gabriel García Márquez"), ("The Odyssey", "Homer"),
    ("Frankenstein", "Mary Shelley"), ("Crime and Punishment", "Fyodor Dostoevsky"),
    ("To Kill a Mockingbird", "Harper Lee"), ("The Great Gatsby", "F. Scott Fitzgerald"),
    ("Moby-Dick", "Herman Melville"), ("Jane Eyre", "Charlotte Brontë"),
    ("The Tale of Genji", "Murasaki Shikibu"),
    ("War and Peace", "Leo Tolstoy"), ("Beloved", "Toni Morrison"),
    ("The Little Prince", "Antoine de Saint-Exupéry"),
    ("Macbeth", "William Shakespeare"), ("The Metamorphosis", "Franz Kafka"),
    ("Dracula", "Bram Stoker"),
    ("Of Mice and Men", "John Steinbeck"), ("The Divine Comedy", "Dante Alighieri"),
)
ART_MOVEMENTS = (
    "Impressionism", "Cubism", "Surrealism", "the Baroque", "Romanticism", "Art Nouveau",
    "Abstract Expressionism", "Pop Art", "Renaissance painting", "Ukiyo-e woodblock prints",
    "Gothic architecture", "Minimalism", "Bauhaus design", "Dada", "Realism", "Art Deco",
    "Post-Impressionism", "Futurism", "Byzantine mosaics", "the Harlem Renaissance",
)
HUMANITIES_FRAMES = (
    "", "Keep it brief.", "Answer for a high school student.", "Use no more than 150 words.",
    "Include one specific example.", "Write it as a short paragraph.", "Use a few bullet points.",
    "Mention one point that people often get wrong.",
)


HISTORY_QUESTIONS = (
    "What were the main causes of {e}?", "How did {e} change everyday life for ordinary people?",
    "Summarize {e} in a few sentences.", "What were the long-term consequences of {e}?",
    "Why do historians still debate {e}?", "Who were the key figures in {e}, and what did they do?",
)
PHILOSOPHY_QUESTIONS = (
    "Explain {i}, associated with {w}, in simple terms.",
    "What are the strongest objections to {i}, as defended by {w}?",
    "How might {w}'s ideas about {i} apply to modern life?",
    "What problem was {w} trying to solve with {i}?",
)
LITERATURE_QUESTIONS = (
    "What are the main themes of {t} by {a}?", "Why is {t} by {a} still widely read today?",
    "Describe the main character of {t} by {a}.", "Write a short study guide for {t} by {a}.",
    "How does the setting shape the story in {t} by {a}?",
)
ART_QUESTIONS = (
    "What are the defining features of {m}?", "How did {m} influence later art?",
    "Name some important artists of {m} and describe their style.",
    "What historical conditions gave rise to {m}?",
)


def _humanities_core(rng: random.Random) -> str:
    kind = rng.randrange(4)  # history, philosophy, literature, art equally often
    if kind == 0:
        return rng.choice(HISTORY_QUESTIONS).format(e=rng.choice(HISTORY_EVENTS))
    if kind == 1:
        who, idea = rng.choice(PHILOSOPHY_IDEAS)
        return rng.choice(PHILOSOPHY_QUESTIONS).format(w=who, i=idea)
    if kind == 2:
        title, author = rng.choice(LITERARY_WORKS)
        return rng.choice(LITERATURE_QUESTIONS).format(t=title, a=author)
    return rng.choice(ART_QUESTIONS).format(m=rng.choice(ART_MOVEMENTS))


def _humanities(rng: random.Random) -> str:
    return f"{_humanities_core(rng)} {rng.choice(HUMANITIES_FRAMES)}"


# ---------------------------------------------------------------------------------------------
# roleplay: "You are a {role}. {situation}"
# ---------------------------------------------------------------------------------------------

ROLES = (
    "friendly barista", "ship's captain", "museum tour guide", "medieval blacksmith",
    "park ranger", "pirate", "detective in 1920s London", "kindergarten teacher",
    "chef at a busy bistro",
    "astronaut on the space station", "librarian", "wizard's apprentice", "personal fitness coach",
    "travel agent", "zookeeper", "lighthouse keeper", "car mechanic", "tech support agent",
    "Roman senator", "beekeeper", "marine biologist", "mountain guide", "bakery owner",
    "radio DJ", "flight attendant", "game show host", "florist", "retired detective",
    "robot butler", "knight guarding a castle gate", "hotel concierge", "village healer",
    "train conductor", "street magician", "archaeologist", "fashion designer",
    "farmer", "news reporter", "dragon who guards a library", "customer service representative",
)
ROLEPLAY_VISITORS = (
    "a nervous first-time visitor", "a curious child", "an impatient customer",
    "a tourist who speaks little English",
    "an old friend you haven't seen in years", "a journalist", "a new apprentice",
    "a skeptical inspector",
    "a lost traveler", "a student writing a report", "your strict boss", "a famous celebrity",
)
ROLEPLAY_SITUATIONS = (
    "{v} asks you what a typical day in your job looks like. Answer in character.",
    "{v} asks for your best advice. Respond in character.",
    "{v} wants to know the hardest part of your work. Reply in character.",
    "Greet {v} and introduce yourself.",
    "{v} complains that something went wrong. Calm them down and help them.",
    "{v} asks you to tell a short story from your career.",
    "Explain one of the tools you use every day to {v}.",
    "{v} asks why you chose this line of work. Answer in character.",
    "Give {v} a quick tour and describe what they are seeing.",
    "{v} wants to try your job for one day. Give them instructions.",
    "{v} asks you for a recommendation. Stay in character.",
    "Write a short welcome speech for {v}.",
    "{v} asks what the funniest thing that ever happened to you at work was.",
    "Politely turn down an unusual request from {v}.",
)


def _roleplay(rng: random.Random) -> str:
    role = rng.choice(ROLES)
    article = "an" if role[0] in "aeiou" else "a"
    situation = rng.choice(ROLEPLAY_SITUATIONS).format(v=rng.choice(ROLEPLAY_VISITORS))
    return f"You are {article} {role}. {situation[0].upper()}{situation[1:]}"


# ---------------------------------------------------------------------------------------------
# Building, splitting and storing
# ---------------------------------------------------------------------------------------------

_GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "chat": _chat, "writing": _writing, "coding": _coding, "math": _math, "reasoning": _reasoning,
    "extraction": _extraction, "stem": _stem, "humanities": _humanities, "roleplay": _roleplay,
}
assert tuple(_GENERATORS) == CATEGORIES

# Draws allowed per requested prompt before giving up: generous, since late draws mostly collide.
_ATTEMPTS_PER_PROMPT = 40
# A run of this many duplicates in a row means the category is (nearly) exhausted; stop early so
# an impossible request fails in seconds instead of drawing per_category * 40 times.
_MAX_CONSECUTIVE_DUPLICATES = 20_000


def normalize(text: str) -> str:
    """Key for deduplication: lowercase with whitespace collapsed."""
    return " ".join(text.lower().split())


def template_key(category: str, text: str) -> str:
    # Prompts that differ only in their numbers come from the same template instance (e.g. the
    # same word problem with other quantities); keeping them on one side of the split stops the
    # eval set from being near-copies of training prompts.
    return category + ":" + re.sub(r"\d+", "#", normalize(text))


def _tidy(text: str) -> str:
    # Collapse runs of spaces left by empty template slots, but keep paragraph breaks.
    return "\n\n".join(" ".join(part.split()) for part in text.strip().split("\n\n"))


def build_prompts(per_category: int, seed: int = 0) -> list[Prompt]:
    """`per_category` unique prompts for every category, deterministic for `seed`."""
    if not isinstance(per_category, int) or per_category < 1:
        raise ValueError(f"per_category must be a positive integer, got {per_category!r}")
    seen: set[str] = set()
    prompts: list[Prompt] = []
    for category in CATEGORIES:
        # One RNG per category (seeded by string, which is stable across runs) so categories
        # do not shift each other when one generator changes.
        rng = random.Random(f"dflash-prompts:{seed}:{category}")
        count = misses = 0
        for _ in range(per_category * _ATTEMPTS_PER_PROMPT + 1000):
            text = _tidy(_GENERATORS[category](rng))
            key = normalize(text)
            if key in seen:
                misses += 1
                if misses > _MAX_CONSECUTIVE_DUPLICATES:
                    break
                continue
            misses = 0
            seen.add(key)
            prompts.append(Prompt(f"{category}-{count:05d}", category, text))
            count += 1
            if count == per_category:
                break
        if count < per_category:
            raise ValueError(f"category {category!r} produced only {count} unique prompts, "
                             f"fewer than the {per_category} requested")
    return prompts


def _pick_eval(group_lists: list[list[Prompt]], need: int) -> list[Prompt]:
    # Take whole template groups first; only split a group if nothing else fits.
    chosen: list[Prompt] = []
    skipped: list[list[Prompt]] = []
    for group in group_lists:
        if len(chosen) + len(group) <= need:
            chosen.extend(group)
        else:
            skipped.append(group)
        if len(chosen) == need:
            return chosen
    for group in sorted(skipped, key=len):
        chosen.extend(group[: need - len(chosen)])
        if len(chosen) == need:
            break
    return chosen


def split_prompts(
    prompts: Iterable[Prompt], eval_per_category: int, seed: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """Split into (train, eval) with exactly `eval_per_category` eval prompts per category.

    Eval and train share no normalized text, and prompts from one number-masked template
    instance stay on one side whenever the counts allow. Input order is kept in both outputs.
    """
    if not isinstance(eval_per_category, int) or eval_per_category < 0:
        raise ValueError(
            f"eval_per_category must be a non-negative integer, got {eval_per_category!r}"
        )
    items = list(prompts)
    eval_ids: set[int] = set()
    for category in dict.fromkeys(p.category for p in items):
        groups: dict[str, list[Prompt]] = {}
        texts: set[str] = set()
        for p in items:
            if p.category == category and normalize(p.text) not in texts:
                texts.add(normalize(p.text))
                groups.setdefault(template_key(category, p.text), []).append(p)
        if len(texts) < eval_per_category:
            raise ValueError(f"category {category!r} has only {len(texts)} distinct prompts, "
                             f"fewer than eval_per_category={eval_per_category}")
        order = sorted(groups)  # sorted first so the shuffle depends only on the seed and content
        random.Random(f"dflash-split:{seed}:{category}").shuffle(order)
        eval_ids.update(id(p) for p in _pick_eval([groups[k] for k in order], eval_per_category))
    eval_set = [p for p in items if id(p) in eval_ids]
    eval_texts = {normalize(p.text) for p in eval_set}
    train = [p for p in items if id(p) not in eval_ids and normalize(p.text) not in eval_texts]
    return train, eval_set


def more_prompts(per_category: int, used: Iterable[Prompt], held_out: Iterable[Prompt],
                 seed: int = 0) -> list[Prompt]:
    """`per_category` new prompts per category from the same generator (for another training
    round): none repeats a text in `used` or `held_out`, and none shares a number-masked template
    with `held_out`, so the evaluation split stays unseen."""
    held_out = list(held_out)
    seen = {normalize(p.text) for p in [*used, *held_out]}
    blocked = {template_key(p.category, p.text) for p in held_out}
    wanted = len(seen) // len(CATEGORIES) + 2 * per_category
    while True:
        counts: dict[str, int] = {}
        chosen = []
        for p in build_prompts(wanted, seed=seed):
            if (normalize(p.text) in seen or template_key(p.category, p.text) in blocked
                    or counts.get(p.category, 0) >= per_category):
                continue
            counts[p.category] = counts.get(p.category, 0) + 1
            chosen.append(p)
        if all(counts.get(c, 0) == per_category for c in CATEGORIES):
            return chosen
        wanted *= 2  # build_prompts raises once a category runs out of unique prompts


def write_jsonl(path: str | os.PathLike[str], prompts: Iterable[Prompt]) -> None:
    """Write one `{"id", "category", "prompt"}` object per line (plus source, task and
    followup when set), atomically; gzipped when the name ends in .gz."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temp file in the same directory, then rename: readers never see a partial file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            # mtime=0: the same prompts always give the same .gz bytes (a committed artefact)
            binary = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if path.suffix == ".gz" else raw
            f = io.TextIOWrapper(binary, encoding="utf-8")
            for p in prompts:
                row = {"id": p.id, "category": p.category, "prompt": p.text}
                row.update({k: v for k, v in (("source", p.source), ("task", p.task),
                                              ("followup", p.followup)) if v})
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.close()  # closes the gzip stream and the file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_jsonl(path: str | os.PathLike[str]) -> list[Prompt]:
    """Read prompts written by `write_jsonl`, gzipped or not (blank lines are ignored); the
    evaluation files' `text` field stands for `prompt`."""
    prompts = []
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                row = json.loads(line)
                text = row.get("prompt", row.get("text"))
                if text is None or "id" not in row or "category" not in row:
                    raise DFlashError(f"{path} line {number}: a prompt needs id, category and "
                                     "prompt (or text)")
                prompts.append(Prompt(id=row["id"], category=row["category"], text=text,
                                      source=row.get("source", ""), task=row.get("task", ""),
                                      followup=row.get("followup")))
    return prompts


def spread_over_categories(prompts: list[Prompt], limit: int | None) -> list[Prompt]:
    """At most `limit` prompts, taken round-robin over categories (all of them if None)."""
    if limit is None or limit >= len(prompts):
        return list(prompts)
    by_category: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    picked: list[Prompt] = []
    for rank in range(max(len(v) for v in by_category.values())):
        for group in by_category.values():
            if rank < len(group) and len(picked) < limit:
                picked.append(group[rank])
    return picked
