"""WordNet 3.0 (Debian wordnet-base): familiar words with their glosses, near-synonyms to
compare, topics by lexicographer class, and hobbies, dishes and jobs found under chosen
hypernyms."""

from __future__ import annotations

import random
from pathlib import Path

from dflash_plugin.train.sources.base import Material, SourceInfo

INFO = SourceInfo("wordnet", "wordnet-base", "WordNet 3.0 licence (permissive, notice kept)")

LEXNAMES = ("adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact "
            "noun.attribute noun.body noun.cognition noun.communication noun.event noun.feeling "
            "noun.food noun.group noun.location noun.motive noun.object noun.person "
            "noun.phenomenon noun.plant noun.possession noun.process noun.quantity noun.relation "
            "noun.shape noun.state noun.substance noun.time verb.body verb.change verb.cognition "
            "verb.communication verb.competition verb.consumption verb.contact verb.creation "
            "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative "
            "verb.weather adj.ppl").split()
# Noun classes whose members make good topics, and how a user would name the field.
TOPIC_FIELDS = {"noun.animal": "animals", "noun.artifact": "everyday objects and technology",
                "noun.food": "food and drink", "noun.plant": "plants",
                "noun.phenomenon": "natural phenomena", "noun.body": "the human body",
                "noun.substance": "materials and substances", "noun.event": "events",
                "noun.cognition": "ideas and knowledge", "noun.communication": "communication",
                "noun.location": "places", "noun.object": "the natural world",
                "noun.process": "processes", "noun.state": "states and conditions",
                "noun.feeling": "feelings", "noun.act": "activities"}
# (lemma, lexicographer class) of the hypernyms whose descendants are hobbies, dishes, jobs.
GROUPS = {"hobby": [("sport", "noun.act"), ("musical_instrument", "noun.artifact"),
                    ("game", "noun.act"), ("craft", "noun.act")],
          "dish": [("dish", "noun.food")],
          "role": [("skilled_worker", "noun.person"), ("professional", "noun.person"),
                   ("worker", "noun.person")]}
POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def _parse_data(path: Path):
    synsets = {}
    for line in path.open(encoding="latin-1"):
        if line.startswith("  "):
            continue  # licence header
        head, _, gloss = line.partition(" | ")
        f = head.split()
        offset, lex, n_words = f[0], LEXNAMES[int(f[1])], int(f[3], 16)
        lemmas = [f[4 + 2 * i] for i in range(n_words)]
        at = 4 + 2 * n_words
        n_ptr = int(f[at])
        hypo = [f[at + 1 + 4 * i + 1] for i in range(n_ptr) if f[at + 1 + 4 * i] in ("~", "~i")]
        definition, *examples = [g.strip(' ;"') for g in gloss.strip().split('; "')]
        synsets[offset] = {"lex": lex, "lemmas": lemmas, "hypo": hypo,
                           "gloss": definition.split(";")[0].strip(),
                           "examples": [e for e in examples if e]}
    return synsets


def _familiar(index_path: Path) -> dict[str, list[str]]:
    """lemma -> synset offsets in sense order, for lemmas seen in the tagged corpus."""
    out = {}
    for line in index_path.open(encoding="latin-1"):
        if line.startswith("  "):
            continue
        f = line.split()
        n_senses, n_ptr = int(f[2]), int(f[3])
        tagged = int(f[5 + n_ptr])
        if tagged > 0:
            out[f[0]] = f[6 + n_ptr: 6 + n_ptr + n_senses]
    return out


def _descendants(synsets, roots, depth=2):
    seen, layer = set(), list(roots)
    for _ in range(depth):
        layer = [h for off in layer if off in synsets for h in synsets[off]["hypo"]]
        seen.update(layer)
    return seen - set(roots)


def _plain(lemma: str) -> str:
    return lemma.replace("_", " ").split("(")[0]


def _usable(word: str) -> bool:
    return word.isascii() and word.replace(" ", "").replace("-", "").isalpha() and \
        word.islower() and len(word) >= 3


def materials(root: Path, rng: random.Random) -> list[Material]:
    wn = root / "usr/share/wordnet"
    out: list[Material] = []
    noun = _parse_data(wn / "data.noun")
    noun_index = _familiar(wn / "index.noun")
    for pos, data in (("n", noun), ("v", _parse_data(wn / "data.verb")),
                      ("a", _parse_data(wn / "data.adj"))):
        familiar = noun_index if pos == "n" else _familiar(wn / f"index.{'verb' if pos == 'v' else 'adj'}")
        for lemma, offsets in familiar.items():
            word = _plain(lemma)
            first = data.get(offsets[0])
            if not _usable(word) or first is None:
                continue
            fields = {"word": word, "pos": POS_NAMES[pos], "gloss": first["gloss"]}
            out.append(Material("word", fields, f"word:{pos}:{word}"))
            proper = not any(w.lower() == lemma and w.islower() for w in first["lemmas"])
            if pos == "n" and first["lex"] in TOPIC_FIELDS and len(offsets) <= 3 and not proper:
                out.append(Material("topic", {"thing": word, "field": TOPIC_FIELDS[first["lex"]],
                                              "gloss": first["gloss"]}, f"topic:{word}"))
                if first["lex"] == "noun.artifact":
                    out.append(Material("object", {"thing": word}, f"object:{word}"))
            synonyms = [_plain(w) for w in first["lemmas"] if _plain(w) != word]
            synonyms = [s for s in synonyms if _usable(s) and s.replace(" ", "_") in familiar]
            if synonyms:
                other = rng.choice(synonyms)
                pair = sorted((word, other))
                out.append(Material("word_pair", {"a": pair[0], "b": pair[1]},
                                    f"pair:{pair[0]}:{pair[1]}"))
    # Siblings under one hypernym ("viola" / "violin") compare well; an odd one out needs a
    # word from another class.
    concrete = ("noun.animal", "noun.food", "noun.plant", "noun.artifact", "noun.body",
                "noun.substance")
    parents = [s for s in noun.values() if len(s["hypo"]) >= 3 and s["lex"] in concrete]
    nouns_by_lex: dict[str, list[str]] = {}
    for off, s in noun.items():
        w = _plain(s["lemmas"][0])
        if _usable(w) and s["lemmas"][0] in noun_index:
            nouns_by_lex.setdefault(s["lex"], []).append(w)
    for s in parents:
        kids = [_plain(noun[h]["lemmas"][0]) for h in s["hypo"] if h in noun]
        kids = [k for k in kids if _usable(k) and k.replace(" ", "_") in noun_index]
        if len(kids) >= 3:
            three = rng.sample(kids, 3)
            other_lex = rng.choice([lx for lx in nouns_by_lex if lx != s["lex"]
                                    and lx in concrete])
            odd = rng.choice(nouns_by_lex[other_lex])
            items = three + [odd]
            rng.shuffle(items)
            out.append(Material("odd_one_out", {"items": ", ".join(items)},
                                f"odd:{'|'.join(sorted(items))}"))
            a, b = three[:2]
            out.append(Material("word_pair", {"a": a, "b": b}, f"pair:{min(a, b)}:{max(a, b)}"))
    by_lemma = {}
    for off, s in noun.items():
        for lemma in s["lemmas"]:
            by_lemma.setdefault((lemma.lower(), s["lex"]), []).append(off)
    for kind, roots in GROUPS.items():
        offsets = [by_lemma[r][0] for r in roots if r in by_lemma]
        for off in sorted(_descendants(noun, offsets)):
            word = _plain(noun[off]["lemmas"][0])
            if _usable(word):
                name = {"hobby": "activity", "dish": "dish", "role": "role"}[kind]
                out.append(Material(kind, {name: word, "gloss": noun[off]["gloss"]},
                                    f"{kind}:{word}"))
    return list({m.key: m for m in out}.values())
