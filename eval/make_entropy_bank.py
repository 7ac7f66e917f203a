"""Write ``src/unifiedplayers/data/entropy_bank.json``: the fixed held-out contexts on which the trainer
measures token entropy (entropy retention, Appendix D.2: 256 held-out contexts per role).

    python -m eval.make_entropy_bank            # rewrites the shipped file (deterministic)
    python -m eval.make_entropy_bank --check    # exits 1 if the shipped file differs from a fresh build

Everything is written here from templates with seeded numbers; training never samples these texts (its Planning
prompts come from ``player.topics``, the other players see only Planning's tasks). ``planning``: 256 topic phrases
(a subtopic and a framing); ``execution`` and ``evaluation``: 256 distinct math word problems each, with their
integer answers. Items are interleaved over subtopics or templates, so a small ``trainer.entropy_bank_size``
already covers many kinds.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Callable

SEED = 20260913
PER_ROLE = 256
OUT = Path(__file__).resolve().parents[1] / "src" / "unifiedplayers" / "data" / "entropy_bank.json"

SUBTOPICS = [
    "prime factorisation", "greatest common divisors", "remainders", "digit sums", "linear equations",
    "systems of two equations", "quadratic equations", "arithmetic sequences", "geometric sequences",
    "inequalities between integers", "function values", "absolute values", "percent change",
    "ratios and proportions", "means of data sets", "shared work rates", "distance, speed and time",
    "simple interest", "arrangements in a row", "choosing committees", "rolling two dice",
    "paths on a grid", "the pigeonhole principle", "areas of triangles", "circles and arcs",
    "right triangles", "similar triangles", "perimeters of polygons", "volumes of boxes",
    "points in the coordinate plane", "angles in polygons", "clock arithmetic",
]
FRAMINGS = [
    "{}", "{} with small numbers", "{} with large numbers", "{} in everyday life",
    "{} in a story about a school", "{} with fractions", "{} with a hidden pattern", "{} in two stages",
]

Template = Callable[[random.Random], tuple[str, int]]


NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemal", "Lena"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cards", "books", "stamps", "shells"]


def boxes(r: random.Random) -> tuple[str, int]:
    n, b, k, g = r.choice(NAMES), r.randint(3, 12), r.randint(4, 25), r.randint(1, 9)
    it = r.choice(ITEMS)
    return (f"{n} has {b} boxes with {k} {it} in each box and gives away {g} {it}. "
            f"How many {it} are left?"), b * k - g


def shop(r: random.Random) -> tuple[str, int]:
    a, pa, b, pb = r.randint(2, 9), r.randint(2, 15), r.randint(2, 9), r.randint(2, 15)
    return (f"A notebook costs {pa} dollars and a pen costs {pb} dollars. How much do {a} notebooks and "
            f"{b} pens cost in dollars?"), a * pa + b * pb


def change(r: random.Random) -> tuple[str, int]:
    q, p = r.randint(2, 8), r.randint(3, 12)
    paid = q * p + r.randint(1, 30)
    return (f"Tickets cost {p} dollars each. "
            f"Someone buys {q} tickets and pays with {paid} dollars. How much change, in dollars, do they get?"), paid - q * p


def speed(r: random.Random) -> tuple[str, int]:
    v, t = r.randint(30, 90), r.randint(2, 7)
    return f"A car drives at {v} km per hour for {t} hours. How many km does it travel?", v * t


def fuel(r: random.Random) -> tuple[str, int]:
    per, d = r.randint(4, 12), 100 * r.randint(2, 9)
    return f"A car uses {per} liters of fuel per 100 km. How many liters does it use for {d} km?", per * d // 100


def percent(r: random.Random) -> tuple[str, int]:
    p, base = r.choice([10, 20, 25, 50, 75]), 20 * r.randint(2, 30)
    return f"What is {p}% of {base}?", p * base // 100


def discount(r: random.Random) -> tuple[str, int]:
    price, p = 10 * r.randint(3, 40), r.choice([10, 20, 30, 50])
    return (f"A jacket costs {price} dollars and is sold at {p}% off. "
            f"What is the sale price in dollars?"), price * (100 - p) // 100


def average(r: random.Random) -> tuple[str, int]:
    xs = [r.randint(1, 30) for _ in range(3)]
    total = 4 * r.randint(sum(xs) // 4 + 1, sum(xs) // 4 + 20)  # the fourth number is positive
    last = total - sum(xs)
    return (f"The average of four numbers is {total // 4}. Three of them are {xs[0]}, {xs[1]} and {xs[2]}. "
            f"What is the fourth number?"), last


def rectangle(r: random.Random) -> tuple[str, int]:
    w, h = r.randint(2, 15), r.randint(2, 15)
    return (f"A rectangle has an area of {w * h} square meters and a width of {w} meters. "
            f"What is its perimeter in meters?"), 2 * (w + h)


def square_perimeter(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(2, 20), r.randint(2, 20)
    while (a + b) % 2:
        b = r.randint(2, 20)
    return (f"A rectangle is {a} cm long and {b} cm wide. A square has the same perimeter. "
            f"What is the side length of the square in cm?"), (a + b) // 2


def triangle_area(r: random.Random) -> tuple[str, int]:
    b, h = 2 * r.randint(2, 15), r.randint(2, 20)
    return f"A triangle has a base of {b} cm and a height of {h} cm. What is its area in square cm?", b * h // 2


def box_volume(r: random.Random) -> tuple[str, int]:
    a, b, c = r.randint(2, 9), r.randint(2, 9), r.randint(2, 9)
    return f"A box is {a} cm long, {b} cm wide and {c} cm tall. What is its volume in cubic cm?", a * b * c


def pythagoras(r: random.Random) -> tuple[str, int]:
    (a, b, c), k = r.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25)]), r.randint(1, 4)
    return f"A right triangle has legs of length {a * k} and {b * k}. How long is its hypotenuse?", c * k


def divisible(r: random.Random) -> tuple[str, int]:
    a, b = r.choice([(2, 3), (3, 5), (2, 5), (3, 7), (4, 6), (5, 7)])
    n = r.randint(40, 200)
    return (f"How many positive integers less than or equal to {n} are divisible by {a} or by {b}?",
            n // a + n // b - n // math.lcm(a, b))


def gcd_q(r: random.Random) -> tuple[str, int]:
    g, (x, y) = r.randint(2, 12), r.sample(range(2, 16), 2)
    return f"What is the greatest common divisor of {g * x} and {g * y}?", g * math.gcd(x, y)


def remainder(r: random.Random) -> tuple[str, int]:
    a, m = r.randint(100, 999), r.randint(3, 13)
    return f"What is the remainder when {a} is divided by {m}?", a % m


def power_mod(r: random.Random) -> tuple[str, int]:
    b, e, m = r.randint(2, 9), r.randint(10, 60), r.choice([5, 7, 9, 11, 13])
    return f"What is the remainder when {b}^{{{e}}} is divided by {m}?", pow(b, e, m)


def digit_sum(r: random.Random) -> tuple[str, int]:
    n = r.randint(1000, 99999)
    return f"What is the sum of the digits of {n}?", sum(int(d) for d in str(n))


def linear(r: random.Random) -> tuple[str, int]:
    a, x, b = r.randint(2, 12), r.randint(-10, 20), r.randint(-30, 30)
    return f"Solve for x: {a}x + {b} = {a * x + b}.".replace("+ -", "- "), x


def system(r: random.Random) -> tuple[str, int]:
    x, y = r.sample(range(1, 21), 2)  # distinct: "the larger number" exists
    return f"Two numbers add up to {x + y} and differ by {abs(x - y)}. What is the larger number?", max(x, y)


def ages(r: random.Random) -> tuple[str, int]:
    d, b, t = r.randint(2, 10), r.randint(3, 20), r.randint(2, 10)
    total = (b + d + t) + (b + t)
    return (f"Anna is {d} years older than Ben. In {t} years their ages will add up to {total}. "
            f"How old is Ben now?"), b


def arith_seq(r: random.Random) -> tuple[str, int]:
    a, d, n = r.randint(1, 20), r.randint(2, 9), r.randint(8, 30)
    return (f"An arithmetic sequence starts {a}, {a + d}, {a + 2 * d}, ... "
            f"What is its {_ordinal(n)} term?"), a + (n - 1) * d


def geo_seq(r: random.Random) -> tuple[str, int]:
    a, q, n = r.randint(1, 5), r.choice([2, 3]), r.randint(4, 8)
    return (f"A geometric sequence starts {a}, {a * q}, {a * q * q}, ... "
            f"What is its {_ordinal(n)} term?"), a * q ** (n - 1)


def series_sum(r: random.Random) -> tuple[str, int]:
    n = r.randint(10, 100)
    return f"What is the sum of all integers from 1 to {n}?", n * (n + 1) // 2


def work(r: random.Random) -> tuple[str, int]:
    a, b = r.choice([(3, 6), (4, 12), (6, 12), (10, 15), (12, 24), (20, 30), (6, 3), (12, 4)])
    return (f"One worker paints a fence in {a} hours and another paints it in {b} hours. "
            f"How many hours do they take together?"), a * b // (a + b)


def interest(r: random.Random) -> tuple[str, int]:
    p, rate, y = 100 * r.randint(2, 50), r.randint(2, 9), r.randint(1, 5)
    text = f"How much simple interest, in dollars, do {p} dollars earn at {rate}% per year in {y} years?"
    return text, p * rate * y // 100


def arrangements(r: random.Random) -> tuple[str, int]:
    n = r.randint(3, 7)
    return f"In how many ways can {n} different books be arranged in a row on a shelf?", math.factorial(n)


def committees(r: random.Random) -> tuple[str, int]:
    n, k = r.randint(5, 12), r.randint(2, 4)
    text = f"In how many ways can a committee of {k} people be chosen from {n} people?"
    return text, math.comb(n, k)


def dice(r: random.Random) -> tuple[str, int]:
    s = r.randint(3, 11)
    ways = sum(1 for a in range(1, 7) for b in range(1, 7) if a + b == s)
    return f"Two six-sided dice are rolled. In how many of the 36 outcomes is the sum equal to {s}?", ways


def grid(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(2, 6), r.randint(2, 6)
    return (f"Moving only right or up, how many shortest paths go from the bottom-left corner to the "
            f"top-right corner of a {a} by {b} grid of squares?"), math.comb(a + b, a)


def polygon_angles(r: random.Random) -> tuple[str, int]:
    n = r.randint(5, 12)
    return f"What is the sum, in degrees, of the interior angles of a polygon with {n} sides?", 180 * (n - 2)


def coordinates(r: random.Random) -> tuple[str, int]:
    a, b, c = r.choice([(3, 4, 5), (6, 8, 10), (5, 12, 13), (8, 6, 10)])
    x, y = r.randint(-9, 9), r.randint(-9, 9)
    return f"What is the distance between the points ({x}, {y}) and ({x + a}, {y + b})?", c


# Word-problem templates: each draws its numbers and returns (question, integer answer).
TEMPLATES: list[Template] = [boxes, shop, change, speed, fuel, percent, discount, average, rectangle,
    square_perimeter, triangle_area, box_volume, pythagoras, divisible, gcd_q, remainder, power_mod,
    digit_sum, linear, system, ages, arith_seq, geo_seq, series_sum, work, interest, arrangements,
    committees, dice, grid, polygon_angles, coordinates]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def build(seed: int = SEED) -> dict:
    """The bank as a JSON-able dict (deterministic in ``seed``)."""
    rng = random.Random(seed)
    planning = [f.format(s) for f in FRAMINGS for s in SUBTOPICS][:PER_ROLE]  # round-robin over subtopics
    questions: list[dict] = []
    seen: set[str] = set()
    while len(questions) < 2 * PER_ROLE:
        for t in TEMPLATES:  # one of each template per round: the first items cover every kind
            for _ in range(100):  # redraw a duplicate (a template with few distinct values)
                q, a = t(rng)
                if q not in seen:
                    break
            else:
                continue
            seen.add(q)
            questions.append({"question": q, "answer": str(a), "template": t.__name__})
            if len(questions) == 2 * PER_ROLE:
                break
    return {"version": 1, "generator": "python -m eval.make_entropy_bank", "seed": seed, "planning": planning,
            "execution": questions[:PER_ROLE], "evaluation": questions[PER_ROLE:]}


def dumps(bank: dict) -> str:
    return json.dumps(bank, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing it")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text = dumps(build())
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'differs from a fresh build'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
