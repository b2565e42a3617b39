"""Task families: what a user asks about a piece of source material, in many phrasings.

A family fixes the category and the kinds of material it can use; each prompt picks one of
its phrasings at random, fills it from the material, and sometimes roughens it the way people
type (lower-case start, no final punctuation, a small typo, a greeting). Some prompts carry a
follow-up message, asked later on the target's own first answer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

LANG_NAMES = {"python": "Python", "javascript": "JavaScript", "go": "Go", "rust": "Rust",
              "c": "C", "shell": "shell", "sql": "SQL", "perl": "Perl"}
OTHER_LANGS = ("Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C#", "C++", "Kotlin")
PROGRAMMING = {"Python", "Python graph algorithms", "Node.js", "Perl", "Go", "Rust", "C",
               "SQL (SQLite)", "git"}
STEM_FIELDS = {"animals", "plants", "natural phenomena", "the human body",
               "materials and substances", "processes", "the natural world",
               "everyday objects and technology", "states and conditions"}


@dataclass(frozen=True)
class Family:
    name: str
    category: str   # a category name, or "domain" / "field": decided by the material
    kinds: tuple[str, ...]
    phrasings: tuple[str, ...]
    followups: tuple[str, ...] = ()


F = Family
PASSAGE_KINDS = ("story_passage", "old_text_passage", "tech_passage")
CODE_LANGS_TESTABLE = ("python", "go", "rust", "c", "javascript", "perl")

FAMILIES: tuple[Family, ...] = (
    # -- words ------------------------------------------------------------------------------
    F("word-define", "humanities", ("word",), (
        "What does '{word}' mean?", "define {word}", "What's the meaning of the {pos} "
        "\"{word}\"? Give an example sentence too.", "I came across the word '{word}' in a "
        "book. What does it mean?", "Explain the word {word} to a 10 year old.",
        "Is '{word}' a formal word? What does it mean and when would I use it?",
        "what does {word} mean and where does the word come from?",
        "English isn't my first language. How is '{word}' used?"),
      ("Can you use it in a sentence?", "What's the opposite?", "any synonyms?")),
    F("word-usage", "writing", ("word",), (
        "Use '{word}' in three different sentences.", "Write a short paragraph that uses the "
        "word \"{word}\" naturally.", "Give me some synonyms for {word} and explain how they "
        "differ.", "What's a good alternative to '{word}' in formal writing?",
        "write a four line poem that includes the word {word}",
        "Can you make up a short dialogue where someone uses the word {word}?"),
      ("Make it funnier.", "Now a more formal version.", "shorter please")),
    F("word-compare", "humanities", ("word_pair",), (
        "What's the difference between '{a}' and '{b}'?", "{a} vs {b}: are they the same "
        "thing?", "When should I say {a} and when {b}?", "Can {a} and {b} be used "
        "interchangeably? Give examples.", "my teacher said {a} and {b} are different but I "
        "don't see how. explain?", "Is there any real difference between a {a} and a {b}?"),
      ("Can you give an example of each?", "Which one is more common?")),
    F("topic-explain", "field", ("topic",), (
        "Tell me about {thing}.", "What is {thing}?", "Explain {thing} in simple terms.",
        "I know nothing about {thing}. Give me a quick overview.", "What are five interesting "
        "facts about {thing}?", "Could you explain what {thing} is and why it matters?",
        "my kid asked me what {thing} is and I had no idea lol. help?",
        "Write a short encyclopedia-style entry on {thing}."),
      ("Can you give an example?", "Explain it like I'm 10.", "What's a common misconception "
       "about it?", "Summarise that in one sentence.")),
    F("topic-story", "writing", ("topic",), (
        "Write a short story where {thing} plays an important part.", "write a funny story "
        "for kids about {thing}", "Can you write a poem about {thing}?", "A limerick about "
        "{thing}, please.", "Write a short scene, with dialogue, in which two friends argue "
        "about {thing}.", "Write a haiku about {thing}.", "Give me a creative writing prompt "
        "involving {thing}, then write the first paragraph.", "Write a short mystery story in "
        "which {thing} turns out to be the key clue."),
      ("Make it shorter.", "Can you give it a title?", "Make the ending sadder.",
       "Rewrite it for a 7 year old.")),
    F("odd-one-out", "reasoning", ("odd_one_out",), (
        "Which one doesn't belong: {items}? Explain.", "odd one out: {items}. and why?",
        "Find the one that doesn't fit and explain your reasoning: {items}",
        "Here are four words: {items}. Group them and say which is the odd one out."),
      ("Could a different answer also be argued?", "Why?")),
    # -- everyday life ------------------------------------------------------------------------
    F("hobby-start", "chat", ("hobby",), (
        "I want to get into {activity}. Where do I start?", "How do I learn {activity} as an "
        "adult beginner?", "What do I need to start with {activity} on a budget?", "Any tips "
        "for getting better at {activity}? I've been at it a few months.", "My kid wants to "
        "try {activity}. Is it a good hobby for a 10 year old?", "What is {activity}, and is "
        "it hard to pick up?", "Convince me to try {activity} this year."),
      ("What if I only have an hour a week?", "Can you make that a checklist?",
       "thanks! what else should I know?")),
    F("dish-cook", "chat", ("dish",), (
        "How do I make {dish} at home?", "What is {dish}? I saw it on a menu.", "Give me a "
        "simple recipe for {dish}.", "I want to cook {dish} for friends this weekend, any "
        "tips?", "Can {dish} be made vegetarian?", "Write a mouth-watering menu description "
        "for {dish}.", "what goes well with {dish} as a side?"),
      ("What if I don't have an oven?", "Can I make it ahead of time?", "make it for 8 people")),
    F("role-play", "roleplay", ("role",), (
        "Pretend you're a {role}. I'm a new apprentice on my first day. Show me the ropes.",
        "Let's roleplay: you are a {role} and I'm a customer with a problem. Start the scene.",
        "act as an experienced {role} and tell me about a typical day", "You are a {role} in "
        "the 1800s. Describe your work to me, in character.", "I'm writing a school report. "
        "Pretend to be a {role} and answer my questions. First: what do you do all day?",
        "Be a {role} giving a talk at a school careers day. Keep it fun.",
        "Act as an interviewer hiring a {role}. Ask me one question at a time."),
      ("*nods* And what's the hardest part?", "Stay in character: what do you like least "
       "about it?", "okay, next question please")),
    F("country-travel", "chat", ("country",), (
        "I'm visiting {capital} in {country} for three days. What should I plan?",
        "What should I know before travelling to {country}?", "Plan a budget weekend in "
        "{capital} for me.", "We're moving to {capital}, {country} for work. What should we "
        "sort out first?", "Is {country} a good place for a family holiday? We have two kids."),
      ("What if it rains the whole time?", "Can you make that a packing list?")),
    F("country-facts", "humanities", ("country",), (
        "Tell me about the history of {country} in a few paragraphs.", "What is {country} "
        "known for?", "The capital of {country} is {capital}, right? Why there?", "What "
        "languages are spoken in {country}, and why?", "Give me a short overview of the "
        "geography and economy of {country}."),
      ("What's something most people get wrong about it?", "Summarise in 3 bullet points.")),
    F("roleplay-guide", "roleplay", ("country",), (
        "You're a tour guide in {capital}. I'm a tourist who just arrived. Greet me and "
        "suggest what to do.", "Pretend you're a local from {capital}, {country}, and I'm "
        "asking you for directions and a good place to eat.", "Act as a travel agent. I want "
        "a trip to {country} but I'm nervous about flying. Talk me through it."),
      ("That sounds great, what about the evening?", "*checks watch* We only have two hours.")),
    F("math-distance", "math", ("city_pair",), (
        "How far is it from {a} (lat {lat_a}, lon {lon_a}) to {b} (lat {lat_b}, lon {lon_b}) "
        "as the crow flies? Use the haversine formula and show the steps.", "Given "
        "coordinates {a}: {lat_a}, {lon_a} and {b}: {lat_b}, {lon_b}, estimate the great "
        "circle distance between them.", "A plane flies at 800 km/h. Roughly how long from "
        "{a} ({lat_a}, {lon_a}) to {b} ({lat_b}, {lon_b})? Explain how you got the distance."),
      ("Why can't I just use Pythagoras?", "What if it were 900 km/h?")),
    # -- passages ---------------------------------------------------------------------------
    F("passage-summarise", "extraction", PASSAGE_KINDS, (
        "Summarise this:\n\n{passage}", "Can you give me the gist of this in a few sentences?"
        "\n\n{passage}", "{passage}\n\nTL;DR?", "Summarise this passage from {work} in 3 "
        "bullet points:\n\n{passage}", "I don't have time to read this. What's the main "
        "point?\n\n{passage}", "Write a one-paragraph summary of the following text.\n\n"
        "{passage}"),
      ("Now in one sentence.", "What's the most important detail you left out?")),
    F("passage-extract", "extraction", PASSAGE_KINDS, (
        "List every person, place and thing named in this passage:\n\n{passage}",
        "Pull out the key facts from this as a bulleted list:\n\n{passage}",
        "From the text below, extract any names, numbers and dates into a table.\n\n{passage}",
        "{passage}\n\nWhat questions does this text answer? List them with short answers.",
        "Turn this into a JSON object with the main topic, the key terms and a one-line "
        "summary:\n\n{passage}"),
      ("Now put that in a table.", "Now as JSON.", "Which of those is most important?")),
    F("passage-rewrite", "writing", ("story_passage", "old_text_passage"), (
        "Rewrite this in modern, everyday English:\n\n{passage}", "Can you turn this into "
        "a text message conversation?\n\n{passage}", "Rewrite this passage from {work} as a "
        "news report.\n\n{passage}", "Make this easier to read for a 12 year old:\n\n"
        "{passage}", "{passage}\n\nRewrite that as a short poem.", "Retell this from a "
        "different character's point of view:\n\n{passage}"),
      ("Make it shorter.", "Now make it funny.", "Keep the original tone but simplify it.")),
    F("passage-discuss", "humanities", ("story_passage", "old_text_passage"), (
        "What is going on in this passage from {work}?\n\n{passage}", "Who are the people "
        "in this passage and what do we learn about them?\n\n{passage}", "What's the tone "
        "of this, and how does the writer create it?\n\n{passage}", "I'm studying {work}. "
        "Can you explain this part?\n\n{passage}", "{passage}\n\nWrite five reading "
        "comprehension questions about this, with answers.", "What themes come through in "
        "this passage?\n\n{passage}"),
      ("Can you give a specific quote to back that up?", "How does this compare to today?")),
    F("passage-continue", "writing", ("story_passage",), (
        "Continue this story for a few paragraphs in the same style:\n\n{passage}",
        "{passage}\n\nWhat happens next? Write the next scene.", "Write an alternative "
        "ending to this scene:\n\n{passage}"),
      ("Make it more dramatic.", "Now write it as a script.")),
    F("roleplay-teacher", "roleplay", ("story_passage", "old_text_passage"), (
        "Act as my literature tutor. Ask me questions about this passage one at a time to "
        "check I understood it:\n\n{passage}", "Pretend you're the narrator of this passage "
        "and I'm interviewing you about what happened.\n\n{passage}", "Let's do a scene. "
        "You play one of the people in this passage, I'll play a visitor who has just "
        "arrived. Start in character.\n\n{passage}", "{passage}\n\nYou're a museum guide "
        "and this text is on display. Introduce it to a group of teenagers."),
      ("I think it's about money? Was I right?", "next question")),
    F("passage-explain", "domain", ("tech_passage",), (
        "Explain this to me like I'm a beginner:\n\n{passage}", "I'm reading {work} and "
        "don't get this part. What does it mean?\n\n{passage}", "{passage}\n\nCan you "
        "explain this with a simple example?", "What's the practical upshot of this? When "
        "would it matter to me?\n\n{passage}", "Rewrite this documentation so it's easier "
        "to follow:\n\n{passage}"),
      ("Can you give a code example?", "What's a common mistake here?", "why?")),
    # -- technical topics and questions ----------------------------------------------------
    F("tech-explain", "domain", ("tech_topic",), (
        "How does {topic} work in {domain}?", "Explain {topic} ({domain}) with an example.",
        "What is {topic} in {domain}? I'm a beginner.", "When would I use {topic} in "
        "{domain}?", "{domain} question: what's {topic} about?", "Can you give me a quick "
        "tutorial on {topic} in {domain}?", "I keep seeing '{topic}' in {domain} docs. "
        "What is it for?"),
      ("Can you show an example?", "What are the common pitfalls?", "why is it designed "
       "that way?")),
    F("roleplay-tutor", "roleplay", ("tech_topic",), (
        "Pretend you're my {domain} tutor. I don't get {topic}. Teach me by asking me "
        "questions one at a time.", "Act as a senior developer doing a code review session "
        "with a junior. The junior asks: 'what's {topic} in {domain} and why should I "
        "care?'", "You're a patient teacher and I'm a student who's scared of {domain}. "
        "Explain {topic} to me gently."),
      ("I think I get it. Can you quiz me?", "hmm, I'm still confused")),
    F("man-explain", "domain", ("man_topic", "c_function", "command"), (
        "What does {name} do? ({summary})", "How do I use {name}? Show me an example.",
        "The man page for {name} says: '{summary}'. Can you explain that in plain English?",
        "When would I need {name}, and what are the gotchas?", "Explain {name}({section}) "
        "to someone new to {domain}."),
      ("Can you show a complete example?", "What are the common errors?")),
    F("howto", "domain", ("command",), (
        "How do I {summary_lc}? ({domain})", "what's the best way to {summary_lc} in "
        "{domain}?", "I need to {summary_lc}. Which tool or function should I use, and how?"),
      ("What if that fails?", "Is there a shorter way?")),
    F("faq", "domain", ("question",), (
        "{question}", "{domain} question: {question}", "{question} (this is about {domain})",
        "Quick {domain} question. {question}", "{question} I've looked around but the "
        "answers confused me."),
      ("Can you give an example?", "why?", "Is that still true today?")),
    F("term-explain", "domain", ("term",), (
        "What does '{term}' mean?", "Explain the term {term} ({domain}).", "My coworker "
        "said '{term}' and I nodded along. What does it actually mean?", "Here's a "
        "definition I found:\n\n{definition}\n\nCan you explain it in simpler words?",
        "{definition}\n\nIs this still accurate or relevant today?"),
      ("Can you use it in a sentence?", "Where does the term come from?")),
    F("satire-explain", "humanities", ("satire",), (
        "Explain the joke in this definition from The Devil's Dictionary:\n\n{definition}",
        "Ambrose Bierce defined '{term}' like this:\n\n{definition}\n\nWhat's he getting at?",
        "Is this definition still funny today? Why or why not?\n\n{definition}",
        "What does this old satirical definition say about the time it was written in?\n\n"
        "{definition}"),
      ("Do you agree with him?", "Is there a modern equivalent?")),
    F("satire-write", "writing", ("satire",), (
        "Write a serious dictionary definition of '{term}', then a sarcastic one.",
        "Write a satirical definition of a modern word in the style of this one:\n\n"
        "{definition}", "Here's a cynical definition:\n\n{definition}\n\nWrite a cheerful, "
        "optimistic one for the same word.", "Pretend you are Ambrose Bierce. A reader asks "
        "you to define '{term}'. Answer in character."),
      ("Do another one.", "Now a modern version.")),
    F("acronym", "stem", ("acronym",), (
        "What is {expansion}? Explain briefly.", "What does {acronym} stand for, and what "
        "is it used for?", "I saw '{acronym}' ({expansion}) in some docs. What is it?"),
      ("Is it still used?",)),
    F("object-advice", "chat", ("object",), (
        "I'm thinking of buying a {thing}. What should I look for?", "How do I look after "
        "a {thing} so it lasts?", "Is a {thing} worth having at home? Pros and cons please.",
        "my {thing} stopped working properly. What are the usual things to check?",
        "What's a {thing} actually for? My partner just bought one."),
      ("What if my budget is small?", "Which brand would you pick?")),
    F("hobby-write", "writing", ("hobby",), (
        "Write a short, persuasive blog post about why everyone should try {activity}.",
        "Write a funny poem about a beginner's first week of {activity}.", "Write a club "
        "announcement inviting new members to a {activity} group.", "Write a short story "
        "about someone who discovers {activity} late in life."),
      ("Make it shorter.", "Add a catchy title.")),
    F("country-write", "writing", ("country",), (
        "Write a postcard home from a holiday in {capital}, {country}.", "Write a short "
        "travel blog intro about arriving in {capital} for the first time.", "Write a poem "
        "about {country} without using its name."),
      ("Make it more vivid.", "shorter please")),
    F("tech-write", "writing", ("tech_topic",), (
        "Write a short blog post introducing {topic} ({domain}) to beginners.", "Write a "
        "friendly explanation of {topic} in {domain} for a team wiki page.", "Write a "
        "tweet-length tip about {topic} in {domain}.", "Write an analogy that explains "
        "{topic} ({domain}) to someone who doesn't code."),
      ("Make it less technical.", "Add a code example.")),
    F("tech-tradeoffs", "reasoning", ("tech_topic",), (
        "What are the pros and cons of {topic} in {domain}? When is it the wrong choice?",
        "A colleague says we should never use {topic} in {domain}. Is that a good rule? "
        "Argue both sides.", "What problem does {topic} solve in {domain}, and what would we "
        "do without it?"),
      ("So what would you do?", "why?")),
    F("passage-infer", "reasoning", ("story_passage", "old_text_passage"), (
        "Based on this passage, what can we infer that isn't said directly? Explain your "
        "reasoning.\n\n{passage}", "{passage}\n\nWhy do you think the people here act the "
        "way they do? Support your answer with the text.", "What's the strongest argument "
        "or point made in this passage, and is it convincing?\n\n{passage}"),
      ("What's the best counter-argument?", "Are you sure? Look again.")),
    F("term-write", "writing", ("term",), (
        "Write a short story that uses the word '{term}' naturally.", "Write a funny "
        "conversation between two coworkers where one keeps saying '{term}'.",
        "Here's an entry from a dictionary:\n\n{definition}\n\nWrite a short, catchy "
        "version of it for a glossary."),
      ("Make it shorter.",)),
    # -- code -------------------------------------------------------------------------------
    F("code-explain", "coding", ("code", "function", "buggy_code"), (
        "What does this {Lang} code do?\n\n{fenced}", "Can you explain this line by line?"
        "\n\n{fenced}", "I found this in our codebase. What's it for?\n{fenced}",
        "{fenced}\n\nexplain this to me like I'm new to {Lang}", "Walk me through what "
        "happens when this runs:\n\n{fenced}", "Add comments to this {Lang} code so a "
        "beginner can follow it:\n\n{fenced}"),
      ("What would you change?", "Can you give an example of calling it?", "now in Python")),
    F("code-tests", "coding", ("function",), (
        "Write unit tests for this {Lang} code:\n\n{fenced}", "How would I test this? "
        "Please write a few test cases.\n\n{fenced}", "{fenced}\n\nWhat edge cases should "
        "I test here? Write the tests too."),
      ("What about error cases?", "Can you use a table-driven style?")),
    F("code-translate", "coding", ("code", "function"), (
        "Rewrite this {Lang} code in {other}:\n\n{fenced}", "can you convert this to "
        "{other}?\n{fenced}", "How would this look in idiomatic {other}?\n\n{fenced}"),
      ("Which version is faster?", "now in Python", "Explain the main differences.")),
    F("code-review", "coding", ("code", "function"), (
        "Review this code. Any bugs, style issues or edge cases?\n\n{fenced}", "How could I "
        "make this more readable?\n\n{fenced}", "{fenced}\n\nIs this efficient? What's its "
        "time complexity?", "Refactor this {Lang} code and explain your changes:\n\n"
        "{fenced}"),
      ("Can you show the final version in full?", "why?")),
    F("code-fix", "coding", ("buggy_code",), (
        "This function has a bug somewhere. Can you find it and fix it?\n\n{fenced}",
        "something's off with this, results are sometimes wrong. what's wrong?\n{fenced}",
        "{fenced}\n\nMy tests fail with this code. Can you spot the mistake?",
        "Debug this {Lang} function for me please:\n\n{fenced}"),
      ("How would a test have caught that?", "Are there other problems?")),
    F("code-write", "coding", ("spec",), (
        "Write a {Lang} function `{name}({args})` that does this: {doc}", "I need a "
        "function that does the following. In {Lang} please.\n\n{doc}", "Can you implement "
        "{name} in {Lang}? Description: {doc}", "How would I write this in {Lang}? {doc}"),
      ("Add some tests.", "now in JavaScript", "What's the time complexity?")),
    F("code-trace", "reasoning", ("function",), (
        "Pick a typical input for this function and trace what it does step by step:\n\n"
        "{fenced}", "{fenced}\n\nWhat would this return for an empty input? And for a "
        "typical one? Reason it through.", "Walk through this {Lang} code with a small "
        "example and show the value of each variable as it runs.\n\n{fenced}"),
      ("What about an edge case?", "Are you sure? Check again.")),
    F("code-predict", "reasoning", ("output_code",), (
        "What does this {Lang} program print? Explain step by step.\n\n{fenced}",
        "Predict the output of this:\n\n{fenced}", "{fenced}\n\nWithout running it, what "
        "gets printed, and why?"),
      ("What if the input changed?", "now in Python")),
    F("compile-error", "coding", ("rust_error",), (
        "Why won't this Rust code compile?\n\n{fenced}", "rustc gives me error {error} on "
        "this. How do I fix it?\n\n{fenced}", "{fenced}\n\nThe compiler complains about "
        "this. Explain the error and show a fix.", "I'm learning Rust and I don't "
        "understand why this fails:\n\n{fenced}"),
      ("Why does Rust work that way?", "Is there another way to fix it?")),
)
BY_NAME = {f.name: f for f in FAMILIES}
BY_KIND: dict[str, list[Family]] = {}
for _f in FAMILIES:
    for _k in _f.kinds:
        BY_KIND.setdefault(_k, []).append(_f)

GENERIC_FOLLOWUPS = {
    "math": ("why?", "Can you check the answer another way?", "Explain the second step again, "
             "I'm lost.", "What if the numbers were doubled?"),
    "reasoning": ("why?", "Are you sure? Double-check it.", "Can you explain it more simply?"),
    "chat": ("thanks! anything else?", "What if I'm on a tight budget?"),
}
OPENERS = ("hey, ", "hi! ", "Hi, ", "quick question: ", "ok so ", "Hello, ", "hi there. ",
           "So, ", "Hey there, ", "um, ")
CLOSERS = (" thanks!", " thx", " Thanks in advance.", " please", " Keep it short please.",
           " I'm a beginner btw.", " no need for a long answer", " Explain simply please.",
           " Thank you!", " (for a class)")


def roughen(template: str, rng: random.Random) -> str:
    """The phrasing as a person might type it; placeholders stay intact."""
    text = template
    if rng.random() < 0.06:
        words = [m for m in re.finditer(r"(?<![{\w])[a-z]{5,}(?![\w}])", text)]
        if words:
            m = rng.choice(words)
            w = m.group(0)
            i = rng.randrange(1, len(w) - 2)
            text = text[:m.start()] + w[:i] + w[i + 1] + w[i] + w[i + 2:] + text[m.end():]
    starts_free = not text.startswith("{")
    if starts_free and rng.random() < 0.2:
        text = rng.choice(OPENERS) + text[0].lower() + text[1:]
    elif starts_free and rng.random() < 0.25:
        text = text[0].lower() + text[1:]
    if not text.endswith("}") and rng.random() < 0.15:
        text = text.rstrip(".?")
    if rng.random() < 0.12 and not text.endswith("}"):
        text += rng.choice(CLOSERS)
    return text


def category_of(family: Family, fields: dict[str, str]) -> str:
    if family.category == "domain":
        return "coding" if fields.get("domain") in PROGRAMMING else "stem"
    if family.category == "field":
        return "stem" if fields.get("field") in STEM_FIELDS else "humanities"
    return family.category


def fill(family: Family, fields: dict[str, str], rng: random.Random,
         followup_rate: float) -> tuple[str, str, str | None]:
    """(text, category, follow-up or None) for one prompt of `family` on `fields`."""
    values = dict(fields)
    lang = fields.get("lang", "")
    values["Lang"] = LANG_NAMES.get(lang, lang)
    if "code" in fields:
        values["fenced"] = f"```{lang}\n{fields['code']}\n```"
        values["other"] = rng.choice([x for x in OTHER_LANGS if x != values["Lang"]])
    if "summary" in fields:
        s = fields["summary"]
        values["summary_lc"] = s[0].lower() + s[1:] if s else s
    values.setdefault("definition", fields.get("expansion", ""))
    values.setdefault("term", fields.get("acronym", ""))
    values.setdefault("domain", "computing")
    template = roughen(rng.choice(family.phrasings), rng)
    text = template.format(**values)
    category = category_of(family, fields)
    followup = None
    if rng.random() < followup_rate:
        pool = family.followups or GENERIC_FOLLOWUPS.get(category, ("why?",))
        followup = rng.choice(pool)
    return text, category, followup


def ready(fields: dict[str, str], rng: random.Random,
          followup_rate: float) -> tuple[str, str, str | None]:
    """A generated problem: already phrased, only roughened a little."""
    text = fields["text"]
    if rng.random() < 0.15:
        text = rng.choice(OPENERS) + text[0].lower() + text[1:]
    followup = None
    if rng.random() < followup_rate:
        followup = rng.choice(GENERIC_FOLLOWUPS.get(fields["category"], ("why?",)))
    return text, fields["category"], followup
