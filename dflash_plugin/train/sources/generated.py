"""Step-by-step maths and reasoning problems made here from seeded random numbers, real unit
factors and everyday settings. Each generator is its own task family and phrases its problem
in several ways; every problem has a definite answer."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Callable

from dflash_plugin.train.sources.base import Material, SourceInfo

ARITHMETIC = SourceInfo("arithmetic", "generated", "Apache-2.0 (this project)")
ALGEBRA = SourceInfo("algebra", "generated", "Apache-2.0 (this project)")
REASONING = SourceInfo("reasoning", "generated", "Apache-2.0 (this project)")

NAMES = ("Ama", "Ben", "Chloe", "Dev", "Elena", "Femi", "Gus", "Hiro", "Isla", "Jonas", "Kira",
         "Luis", "Mei", "Nils", "Omar", "Paula", "Raj", "Sofia", "Tariq", "Una", "Vik", "Wren",
         "Yara", "Zoltan", "Aisha", "Bruno", "Cleo", "Dara", "Eitan", "Freya", "Goran", "Hana")
ASK = ("", " Show your working.", " Explain step by step.", " Can you walk me through it?",
       " pls show steps", " I want to understand the method, not just the answer.")


def _ask(rng: random.Random) -> str:
    return rng.choice(ASK)


def _money(x: float) -> str:
    return f"{x:,.2f}"


# -- arithmetic: everyday numbers ---------------------------------------------------------------

def percent(rng):
    price = rng.choice((18, 24.99, 35, 49.5, 60, 79.99, 120, 250, 399, 1200))
    pct = rng.choice((10, 12.5, 15, 20, 25, 30, 35, 40, 60))
    item = rng.choice(("jacket", "pair of boots", "blender", "bike helmet", "desk chair",
                       "phone case", "tent", "coffee grinder", "monitor", "sofa"))
    return rng.choice((
        f"A {item} costs ${price} and it's {pct}% off. What do I pay?{_ask(rng)}",
        f"If something is ${price} and the price goes up by {pct}%, what's the new price?",
        f"I paid ${_money(price * (1 - pct / 100))} for a {item} in a {pct}% off sale. "
        f"What was the original price?{_ask(rng)}",
        f"our restaurant bill was ${price} and we want to tip {pct}%. how much is the tip and "
        f"the total? there are {rng.randint(2, 6)} of us splitting it evenly",
        f"My rent went from ${price * 10:.0f} to ${price * 10 * (1 + pct / 100):.0f}. "
        f"What percentage increase is that?"))


UNITS = (("kilometres", "miles", 0.621371), ("miles", "kilometres", 1.609344),
         ("kilograms", "pounds", 2.204623), ("pounds", "kilograms", 0.453592),
         ("litres", "US gallons", 0.264172), ("US gallons", "litres", 3.785412),
         ("metres", "feet", 3.28084), ("feet", "metres", 0.3048), ("inches", "centimetres", 2.54),
         ("centimetres", "inches", 0.393701), ("square metres", "square feet", 10.7639),
         ("cups", "millilitres", 236.588), ("ounces", "grams", 28.3495))


def units(rng):
    a, b, f = rng.choice(UNITS)
    x = rng.choice((3, 5, 7.5, 12, 26.2, 42, 65, 100, 150, 250, 1000))
    t = rng.choice((-10, 0, 18, 25, 37, 40, 100, 180, 220))
    return rng.choice((
        f"How many {b} is {x} {a}?{_ask(rng)}",
        f"convert {x} {a} to {b}",
        f"A recipe/plan I'm following says {x} {a} but I only think in {b}. What's that?",
        f"What is {t} degrees Celsius in Fahrenheit? And how do you convert the other way?",
        f"It's {t} °F outside. Is that cold? What is it in Celsius?{_ask(rng)}"))


def recipe(rng):
    serves, want = rng.sample((2, 3, 4, 6, 8, 10, 12), 2)
    items = rng.sample((("oats", "g", 250), ("sugar", "g", 120), ("butter", "g", 90),
                        ("coconut milk", "ml", 300), ("onions", "", 3), ("rice", "g", 400),
                        ("stock", "ml", 750), ("lentils", "g", 200), ("yogurt", "g", 150),
                        ("olive oil", "tbsp", 3)), 3)
    listed = ", ".join(f"{q}{u} {n}" if u in ("g", "ml") else f"{q} {u + ' ' if u else ''}{n}"
                       for n, u, q in items)
    return rng.choice((
        f"A recipe for {serves} people uses {listed}. How much of each do I need for {want}?",
        f"scale this recipe from {serves} servings to {want}: {listed}",
        f"I'm cooking for {want} but my recipe serves {serves}. It needs {listed}. "
        f"What are the new amounts, and what do I do about anything that doesn't divide "
        f"nicely?"))


def travel(rng):
    d = rng.choice((45, 120, 230, 310, 415, 560, 780))
    v = rng.choice((40, 55, 60, 70, 90, 110))
    stop = rng.choice((15, 20, 30, 45))
    mpg = rng.choice((25, 30, 34, 40, 48))
    price = rng.choice((3.29, 3.89, 4.15, 1.79, 1.95))
    return rng.choice((
        f"I'm driving {d} km at about {v} km/h with one {stop} minute break. If I leave at "
        f"{rng.randint(6, 11)}:{rng.choice(('00', '15', '30', '45'))}, when do I arrive?",
        f"A train covers {d} miles in {d / v:.2f} hours. What's its average speed?{_ask(rng)}",
        f"Is it cheaper to take a ${round(d * 0.15)} train or drive {d} miles in a car that "
        f"averages {mpg} mpg with fuel at ${price}/gallon? Parking is ${stop // 2}.",
        f"Two cyclists start {d} km apart and ride towards each other at {v // 3} km/h and "
        f"{v // 4} km/h. When do they meet?{_ask(rng)}"))


def budget(rng):
    goal = rng.choice((1200, 2500, 4000, 6000, 9000, 15000))
    months = rng.choice((6, 10, 12, 18, 24))
    income = rng.choice((1800, 2400, 3100, 3900, 5200))
    rent_pct = rng.choice((25, 30, 35, 40))
    return rng.choice((
        f"I want to save ${goal} in {months} months. How much a week is that, roughly?",
        f"My take-home pay is ${income} a month and rent is {rent_pct}% of it. If I put 20% "
        f"of what's left into savings, how much do I save in a year?",
        f"I have ${goal} on a credit card at {rng.choice((18, 21, 24.9))}% APR and can pay "
        f"${goal // months} a month. Roughly how long until it's paid off? Explain simply.",
        f"We're {rng.randint(3, 7)} friends sharing a holiday house that costs ${goal} in "
        f"total. One person stays only half the time. What's a fair split?"))


def interest(rng):
    p = rng.choice((1000, 2500, 5000, 10000, 20000))
    r = rng.choice((2.5, 3.1, 3.8, 5, 6.5, 7))
    y = rng.choice((2, 3, 5, 10, 20))
    return rng.choice((
        f"If I invest ${p} at {r}% a year compounded monthly, what will it be worth after "
        f"{y} years?{_ask(rng)}",
        f"What's the difference between simple and compound interest on ${p} at {r}% for "
        f"{y} years? Show both.",
        f"A loan of ${p * 2} at {r}% over {y} years. What's the monthly payment? Use the "
        f"standard formula and explain it.",
        f"At {r}% a year, how long does it take money to double? Is the rule of 72 close?"))


def stats(rng):
    nums = [rng.randint(3, 98) for _ in range(rng.randint(5, 9))]
    label = rng.choice(("test scores", "daily steps (thousands)", "minutes late",
                        "temperatures this week", "orders per day", "goals per season"))
    return rng.choice((
        f"Here are some {label}: {', '.join(map(str, nums))}. What are the mean, median and "
        f"range?",
        f"find the average and standard deviation of {', '.join(map(str, nums))}.{_ask(rng)}",
        f"My {label} were {', '.join(map(str, nums))}. Which is a better summary here, the "
        f"mean or the median, and why?"))


def fractions(rng):
    a, b = Fraction(rng.randint(1, 7), rng.randint(2, 9)), Fraction(rng.randint(1, 7),
                                                                     rng.randint(2, 9))
    op = rng.choice(("+", "-", "*", "÷"))
    return rng.choice((
        f"What is {a} {op} {b}? Simplify the answer.{_ask(rng)}",
        f"how do I work out {a} {op} {b} without a calculator",
        f"Which is bigger, {a} or {b}, and by how much?",
        f"Convert {a} to a decimal and a percentage."))


def area(rng):
    w, l, h = rng.choice((3, 3.5, 4, 4.2, 5)), rng.choice((4, 5, 6.5, 7)), rng.choice((2.4, 2.7))
    r = rng.choice((0.5, 1, 1.5, 2, 3.5))
    return rng.choice((
        f"My room is {w} m by {l} m with {h} m high walls. One litre of paint covers about "
        f"10 m². How much paint do I need for two coats on the walls (ignore the door)?",
        f"How much water does a round paddling pool hold if it's {r * 2} m across and filled "
        f"to 40 cm deep?",
        f"What's the area of a circle with radius {r} m, and its circumference?{_ask(rng)}",
        f"I'm tiling a {w} m by {l} m floor with 30 cm square tiles. How many tiles, with 10% "
        f"extra for breakage?"))


# -- algebra and beyond -------------------------------------------------------------------------

def linear(rng):
    a, b, c, d = (rng.randint(2, 9), rng.randint(-20, 20), rng.randint(1, 5), rng.randint(-20, 20))
    if a == c:
        a += 1
    return rng.choice((f"Solve for x: {a}x + {b} = {c}x + {d}".replace("+ -", "- "),
                       f"solve {a}(x - {abs(b)}) = {c}x + {abs(d)} step by step",
                       f"I keep getting this wrong: {a}x - {abs(b)} = {d}. What's x?"))


def system(rng):
    x, y = rng.randint(-5, 9), rng.randint(-5, 9)
    a, b, c, d = rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6), rng.randint(-6, -1)
    e1, e2 = f"{a}x + {b}y = {a * x + b * y}", f"{c}x + {d}y = {c * x + d * y}".replace("+ -", "- ")
    n1, n2 = rng.sample(("adult tickets", "child tickets", "apples", "pears", "buses", "cars"), 2)
    return rng.choice((
        f"Solve the system: {e1} and {e2}.{_ask(rng)}",
        f"can you solve these simultaneous equations by elimination? {e1}, {e2}",
        f"A shop sold {x + y + 10} items, {n1} and {n2}, for ${a * (x + 5) + b * (y + 5)} in "
        f"total. {n1} cost ${a} and {n2} cost ${b}. How many of each were sold?"))


def quadratic(rng):
    r1, r2 = rng.randint(-7, 7), rng.randint(-7, 7)
    b, c = -(r1 + r2), r1 * r2
    expr = f"x^2 + {b}x + {c}".replace("+ -", "- ")
    return rng.choice((f"Solve {expr} = 0{_ask(rng)}", f"factorise {expr}",
                       f"Where does y = {expr} cross the x-axis, and where is its vertex?"))


def calculus(rng):
    a, n, k = rng.randint(2, 9), rng.randint(2, 5), rng.randint(1, 4)
    f = rng.choice((f"{a}x^{n} - {k}x", f"sin({k}x)", f"e^({k + 2}x) * x^2", f"ln(x^2 + {a})",
                    f"x^{n} * cos(x)", f"({a}x + 1)^{n}"))
    return rng.choice((f"Differentiate f(x) = {f}.{_ask(rng)}",
                       f"What's the integral of {f} dx? If it needs a technique, say which.",
                       f"find the slope of y = {a}x^{n} at x = {k}, and the tangent line",
                       f"What does the derivative of {f} tell us? Explain like I'm new to "
                       f"calculus."))


def probability(rng):
    n = rng.randint(3, 4)
    total = rng.randint(3 * n, 5 * n)
    red, blue = rng.randint(2, 8), rng.randint(2, 8)
    return rng.choice((
        f"If I roll {n} dice, what's the chance the total is {total}?",
        f"A bag has {red} red and {blue} blue marbles. I take two without putting the first "
        f"back. What's the probability both are red?{_ask(rng)}",
        f"What is the probability of getting at least one six in {rng.randint(2, 8)} rolls "
        f"of a die?",
        f"I flip a fair coin {rng.randint(4, 10)} times. What's the chance of exactly "
        f"{rng.randint(1, 3)} heads?",
        f"In a class of {rng.randint(20, 40)}, what's the chance two people share a "
        f"birthday? It seems too high to me."))


def combinatorics(rng):
    n, k = rng.randint(5, 12), rng.randint(2, 4)
    word = rng.choice(("LETTER", "COFFEE", "PEPPER", "STATS", "BALLOON", "ORANGE", "CANOE"))
    return rng.choice((f"How many ways can I choose a team of {k} from {n} people?",
                       f"In how many ways can the letters of {word} be arranged?{_ask(rng)}",
                       f"{n} people at a party all shake hands once. How many handshakes?",
                       f"How many {k}-digit PIN codes have no repeated digit?"))


def sequences(rng):
    a, d, r = rng.randint(1, 9), rng.randint(2, 7), rng.choice((2, 3, Fraction(1, 2)))
    n = rng.randint(8, 30)
    return rng.choice((
        f"What is the sum of the first {n} terms of {a}, {a + d}, {a + 2 * d}, ...?",
        f"Find the {n}th term of the sequence {a}, {a * r}, {a * r * r}, ...",
        f"Does {a} + {a}/2 + {a}/4 + ... ever end up at a finite number? What is it?",
        f"Prove by induction that 1 + 2 + ... + n = n(n+1)/2, and check it for n = {n}."))


def geometry(rng):
    a, b = rng.choice(((3, 4), (5, 12), (6, 8), (8, 15), (7, 24), (9, 12)))
    ang = rng.choice((30, 40, 55, 65, 72))
    return rng.choice((
        f"A right triangle has legs {a} and {b}. What is the hypotenuse and the area?",
        f"A ladder {b} m long leans on a wall with its foot {a} m out. How high up the wall "
        f"does it reach?{_ask(rng)}",
        f"Two angles of a triangle are {ang} and {ang + 20} degrees. What's the third, and "
        f"what kind of triangle is it?",
        f"What's the volume and surface area of a cylinder with radius {a} cm and height "
        f"{b} cm?"))


def number_theory(rng):
    a, b = rng.randint(12, 180), rng.randint(12, 180)
    n = rng.randint(100, 999)
    return rng.choice((f"Find the GCD and LCM of {a} and {b}.{_ask(rng)}",
                       f"What is the prime factorisation of {n}?",
                       f"Is {n} divisible by 3, 7 or 11? Is there a quick trick for each?",
                       f"prove that the product of two consecutive integers is always even",
                       f"What's {a} in binary and in hexadecimal?"))


# -- reasoning ---------------------------------------------------------------------------------

def ordering(rng):
    people = rng.sample(NAMES, 5)
    rel = rng.choice((("taller than", "tallest", "shortest"), ("older than", "oldest", "youngest"),
                      ("finished ahead of", "winner", "last")))
    order = people[:]
    rng.shuffle(order)
    facts = [f"{order[i]} is {rel[0]} {order[i + 1]}" for i in range(4)]
    rng.shuffle(facts)
    return rng.choice((f"{'. '.join(facts)}. Who is the {rel[1]} and who is the {rel[2]}?",
                       f"Logic puzzle: {'; '.join(facts)}. Put them in order and explain how "
                       f"you worked it out."))


def syllogism(rng):
    a, b, c = rng.sample(("cats", "mammals", "pets", "birds", "doctors", "runners", "teachers",
                          "musicians", "students", "engineers", "gardeners", "chess players"), 3)
    form = rng.choice((f"All {a} are {b}. All {b} are {c}. So all {a} are {c}.",
                       f"All {a} are {b}. Some {b} are {c}. So some {a} are {c}.",
                       f"No {a} are {b}. Some {c} are {b}. So some {c} are not {a}.",
                       f"If someone is one of the {a}, they are one of the {b}. Sam is one of "
                       f"the {b}. So Sam is one of the {a}."))
    return rng.choice((f"Is this argument valid? \"{form}\" Explain.",
                       f"my friend said: {form} is that logically right?",
                       f"Check the logic here: {form}"))


def liars(rng):
    a, b, c = rng.sample(NAMES, 3)
    return rng.choice((
        f"On an island, knights always tell the truth and knaves always lie. {a} says "
        f"\"{b} is a knave.\" {b} says \"{a} and {c} are the same type.\" What is {c}?",
        f"Three friends, {a}, {b} and {c}, ate the last cookie... one of them did. {a} says "
        f"\"It was {b}.\" {b} says \"It wasn't me.\" {c} says \"It wasn't me either.\" Only one "
        f"of them is telling the truth. Who ate it?"))


def calendar(rng):
    days = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    n = rng.randint(10, 400)
    return rng.choice((
        f"If today is {rng.choice(days)}, what day of the week will it be in {n} days?",
        f"I was born on a {rng.choice(days)}. My {rng.randint(20, 60)}th birthday is in a leap "
        f"year... can I work out what day it falls on? Explain the reasoning.",
        f"A meeting happens every {rng.randint(3, 9)} days and another every "
        f"{rng.randint(4, 12)} days. Both happened today. When do they next coincide?",
        f"A flight leaves at {rng.randint(6, 11)}:{rng.choice(('05', '40'))} local time, lasts "
        f"{rng.randint(2, 13)} h {rng.randint(0, 55)} min, and lands somewhere "
        f"{rng.randint(1, 9)} hours ahead. What's the local arrival time?"))


def scheduling(rng):
    tasks = rng.sample(("design", "shopping", "paperwork", "painting", "wiring", "testing",
                        "cleaning", "cooking", "packing", "printing"), 4)
    dur = [rng.randint(1, 6) for _ in tasks]
    return (f"I have four jobs: {', '.join(f'{t} ({d} h)' for t, d in zip(tasks, dur))}. "
            f"{tasks[1]} can only start after {tasks[0]}, and {tasks[3]} needs both {tasks[1]} "
            f"and {tasks[2]} done. With two people working, what's the fastest way to finish "
            f"everything?")


def patterns(rng):
    a, d = rng.randint(1, 6), rng.randint(2, 5)
    seq = rng.choice(([a * i * i for i in range(1, 6)], [a + d * i for i in range(5)],
                      [a * d ** i for i in range(5)], [i * (i + a) for i in range(2, 7)],
                      [1, 1, 2, 3, 5, 8][rng.randint(0, 1):]))
    return rng.choice((f"What comes next: {', '.join(map(str, seq))}, ?",
                       f"find the pattern in {', '.join(map(str, seq))} and give the next two "
                       f"numbers"))


def base_rates(rng):
    prev = rng.choice((0.1, 0.5, 1, 2, 5))
    sens = rng.choice((90, 95, 99))
    fp = rng.choice((1, 2, 5, 10))
    return (f"A test for a condition is {sens}% accurate for people who have it, with a {fp}% "
            f"false positive rate. {prev}% of people have it. If I test positive, how likely is "
            f"it that I have it? It feels like it should be {sens}%.")


def tradeoffs(rng):
    a, b = rng.randint(2, 9) * 1000, rng.randint(10, 60)
    return rng.choice((
        f"Is it worth paying ${a // 20} more rent a month for a flat {b} minutes closer to "
        f"the office? I go in {rng.randint(2, 5)} days a week.",
        f"Should I buy a ${a * 3} used car or lease a new one for ${a // 20} a month? I drive "
        f"about {b * 300} miles a year. Walk me through how to decide.",
        f"I can pay ${a} off my student loan (5% interest) or put it in an index fund. What "
        f"should I think about?"))


def fallacy(rng):
    topic = rng.choice(("a new diet", "a phone brand", "a football team", "electric cars",
                        "homework", "a local shop", "remote work", "a vitamin supplement"))
    arg = rng.choice((f"Everyone I know likes {topic}, so it must be the best.",
                      f"A famous actor recommends {topic}, so it must work.",
                      f"If we allow {topic}, next thing you know everything will fall apart.",
                      f"{topic.capitalize()} has been around for ages, so it must be good.",
                      f"You either support {topic} completely or you're against progress.",
                      f"My uncle tried {topic} once and it didn't work, so it never works."))
    return rng.choice((f"What's wrong with this argument? \"{arg}\"",
                       f"someone at work said \"{arg}\" - is there a name for that kind of "
                       f"reasoning?", f"Can you explain the flaw here: {arg}"))


GENERATORS: dict[str, dict[str, Callable[[random.Random], str]]] = {
    "arithmetic": {"math-percent": percent, "math-units": units, "math-recipe": recipe,
                   "math-travel": travel, "math-budget": budget, "math-interest": interest,
                   "math-stats": stats, "math-fractions": fractions, "math-area": area},
    "algebra": {"math-linear": linear, "math-system": system, "math-quadratic": quadratic,
                "math-calculus": calculus, "math-probability": probability,
                "math-combinatorics": combinatorics, "math-sequences": sequences,
                "math-geometry": geometry, "math-number-theory": number_theory},
    "reasoning": {"logic-ordering": ordering, "logic-syllogism": syllogism,
                  "logic-knights": liars, "logic-calendar": calendar,
                  "logic-scheduling": scheduling, "logic-patterns": patterns,
                  "logic-base-rates": base_rates, "logic-tradeoffs": tradeoffs,
                  "logic-fallacy": fallacy},
}


def problems(source: str, rng: random.Random, per_family: int = 1200) -> list[Material]:
    out = []
    category = "reasoning" if source == "reasoning" else "math"
    for family, make in GENERATORS[source].items():
        seen = set()
        for _ in range(per_family * 3):
            text = make(rng)
            if text not in seen:
                seen.add(text)
                out.append(Material("ready", {"text": text, "task": family,
                                              "category": category}, f"{family}:{len(seen)}"))
            if len(seen) >= per_family:
                break
    return out
