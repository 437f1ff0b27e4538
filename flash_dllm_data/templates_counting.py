"""Problem templates about counts, time, distance and volume: reading,
baking, travel, a classroom, ages, fruit, a stamp collection, chores, a
water tank, a basketball game. Each returns (question, Solution)."""

from __future__ import annotations

from flash_dllm_data.gsm_format import Solution
from flash_dllm_data.problem_kit import (BAKED, FRACTIONS, FRUITS,
                                             LENGTHS, VOLUMES, Draw)


def _cap(text: str) -> str:
  return text[:1].upper() + text[1:]


def reading(d: Draw):
  """Pages read over two or three days: 3 or 5 steps."""
  a, s = d.person(), Solution()
  pages, first, m = d.int(60, 400), d.int(5, 40), d.int(2, 3)
  second = s.step(f"On the second day {a.he} reads @ pages.", f"{first}*{m}")
  both = s.step(f"In two days {a.he} reads @ pages.", f"{first}+{second}")
  rest = s.step("That leaves @ pages.", f"{pages}-{both}")
  q = (f"{a.name} is reading a {pages}-page book. {_cap(a.he)} reads {first} "
       f"pages on the first day and {('twice', 'three times')[m - 2]} as many "
       "on the second day.")
  if d.coin():
    third = s.step(f"On the third day {a.he} reads @ pages.", f"{rest}/2")
    s.step("So @ pages are still left.", f"{rest}-{third}")
    q += f" On the third day {a.he} reads half of the remaining pages."
  return q + " How many pages are left to read?", s


def baking(d: Draw):
  """Batches baked, some eaten or given away, packed in boxes: 3-4 steps."""
  a, b, s = d.person(), d.person(), Solution()
  item, trays, each = d.pick(BAKED), d.int(2, 9), d.int(6, 24)
  eaten, box = d.int(1, 10), d.pick((4, 6, 8, 10, 12))
  total = s.step(f"{a.name} bakes @ {item}.", f"{trays}*{each}")
  rest = s.step("After eating some, @ are left.", f"{total}-{eaten}")
  q = (f"{a.name} bakes {trays} trays of {item} with {each} on each tray. "
       f"{_cap(a.he)} eats {eaten} of them")
  if d.coin():
    given = d.int(2, 20)
    rest = s.step(f"After giving some to {b.name}, @ are left.",
                  f"{rest}-{given}")
    q += f" and gives {given} to {b.name}"
  s.step(f"{_cap(a.he)} fills @ boxes.", f"{rest}/{box}")
  return q + (f". {_cap(a.he)} packs the rest into boxes of {box}. How many "
              f"boxes does {a.he} fill?"), s


def travel(d: Draw):
  """Two legs of a drive, optionally the distance still to go: 3-4 steps."""
  a, s = d.person(), Solution()
  unit, speed = d.pick(LENGTHS)
  v1, h1, v2, h2 = d.int(30, 90), d.int(1, 5), d.int(20, 80), d.int(1, 4)
  x1 = s.step(f"First {a.he} drives @ {unit}.", f"{v1}*{h1}")
  x2 = s.step(f"Then {a.he} drives @ {unit}.", f"{v2}*{h2}")
  total = s.step(f"{_cap(a.he)} drives @ {unit} in all.", f"{x1}+{x2}")
  hours = lambda h: f"{h} hour{'s' if h > 1 else ''}"
  q = (f"{a.name} drives at {v1} {speed} for {hours(h1)}, then at {v2} "
       f"{speed} for {hours(h2)}.")
  if d.coin():
    trip = total + d.int(10, 300)
    s.step(f"{_cap(a.he)} still has @ {unit} to go.", f"{trip}-{total}")
    return q + f" The whole trip is {trip} {unit}. How many {unit} are " \
        "left?", s
  return q + f" How many {unit} does {a.he} drive in all?", s


def classroom(d: Draw):
  """A fraction in one club, others in another, pencils: 2-4 steps."""
  a, s = d.person(), Solution()
  k = d.pick(tuple(FRACTIONS))
  n = k * d.int(4, 12)
  club = s.step("@ students are in the chess club.", f"{n}/{k}")
  rest = s.step("@ students are not in the chess club.", f"{n}-{club}")
  who = "not in the chess club"
  q = (f"There are {n} students in {a.name}'s class. "
       f"{_cap(FRACTIONS[k])} of them are in the chess club.")
  if d.coin():
    football = d.int(1, rest - 1)
    rest = s.step("@ students are in neither club.", f"{rest}-{football}")
    q += f" Of the others, {football} play football."
    who = "in neither club"
  if d.coin(0.4):
    pens = d.int(2, 6)
    s.step("They get @ pencils.", f"{rest}*{pens}")
    return q + f" Each student {who} gets {pens} pencils. How many pencils " \
        "is that?", s
  return q + f" How many students are {who}?", s


def ages(d: Draw):
  """Three ages and their sum, optionally some years later: 3 or 5 steps."""
  a, b, c, s = d.person(), d.person(), d.person(), Solution()
  age, k, diff = d.int(3, 15), d.int(2, 4), d.int(2, 30)
  age_b = s.step(f"{b.name} is @ years old.", f"{age}*{k}")
  age_c = s.step(f"{c.name} is @ years old.", f"{age_b}+{diff}")
  total = s.step("Together they are @ years old.", f"{age}+{age_b}+{age_c}")
  q = (f"{a.name} is {age} years old. {b.name} is {k} times as old as "
       f"{a.name}, and {c.name} is {diff} years older than {b.name}.")
  if d.coin():
    years = d.int(2, 10)
    more = s.step("In that time they add @ years.", f"3*{years}")
    s.step("Then their ages add up to @.", f"{total}+{more}")
    return q + f" What will the sum of their ages be in {years} years?", s
  return q + " What is the sum of their ages?", s


def fruit(d: Draw):
  """Baskets of fruit, some given to friends, rest bagged: 3-4 steps."""
  a, s = d.person(), Solution()
  kind, baskets, each = d.pick(FRUITS), d.int(2, 9), d.int(8, 30)
  friends, per = d.int(2, 6), d.int(2, 8)
  total = s.step(f"{a.name} has @ {kind}.", f"{baskets}*{each}")
  given = s.step(f"{_cap(a.he)} gives away @ {kind}.", f"{friends}*{per}")
  left = s.step(f"{_cap(a.he)} has @ {kind} left.", f"{total}-{given}")
  q = (f"{a.name} has {baskets} baskets with {each} {kind} in each. "
       f"{_cap(a.he)} gives {per} {kind} to each of {friends} friends.")
  if d.coin():
    bags = d.pick((2, 3, 4, 5))
    s.step("Each bag gets @.", f"{left}/{bags}")
    return q + f" {_cap(a.he)} splits the rest equally into {bags} bags. " \
        f"How many {kind} go in each bag?", s
  return q + f" How many {kind} does {a.name} have left?", s


def collection(d: Draw):
  """Packs bought, a fraction given away, more received, albums: 4-6 steps."""
  a, b, s = d.person(), d.person(), Solution()
  have, packs, per = d.int(10, 90), d.int(2, 8), d.int(5, 20)
  part = d.pick((2, 3, 4))
  bought = s.step(f"{a.name} buys @ stamps.", f"{packs}*{per}")
  total = s.step(f"{_cap(a.he)} then has @ stamps.", f"{have}+{bought}")
  gone = s.step(f"{_cap(a.he)} gives {b.name} @ stamps.", f"{total}/{part}")
  left = s.step("That leaves @ stamps.", f"{total}-{gone}")
  q = (f"{a.name} has {have} stamps and buys {packs} packs of {per} stamps. "
       f"{_cap(a.he)} gives {FRACTIONS[part]} of all {a.his} stamps to "
       f"{b.name}.")
  if d.coin(0.7):
    gift = d.int(3, 40)
    left = s.step(f"{_cap(a.he)} now has @ stamps.", f"{left}+{gift}")
    q += f" Later {a.his} grandfather gives {a.him} {gift} more."
    if d.coin(0.6):
      albums = d.pick((2, 3, 4))
      s.step("Each album gets @ stamps.", f"{left}/{albums}")
      return q + f" {_cap(a.he)} puts them equally into {albums} albums. " \
          "How many stamps go in each album?", s
  return q + f" How many stamps does {a.name} have now?", s


def chores(d: Draw):
  """Minutes per task, tasks per day, days, in hours: 3-4 steps."""
  a, s = d.person(), Solution()
  task = d.pick(("dog walk", "lesson", "puzzle", "drawing", "lap of the park"))
  minutes, n, days = d.pick((5, 10, 12, 15, 20, 30)), d.int(2, 6), d.int(2, 12)
  daily = s.step("Each day takes @ minutes.", f"{minutes}*{n}")
  q = f"Each {task} takes {a.name} {minutes} minutes. {_cap(a.he)} does {n} " \
      f"a day"
  if d.coin():
    extra = d.pick((5, 10, 15, 20))
    daily = s.step("With the break it is @ minutes a day.", f"{daily}+{extra}")
    q += f" and takes a {extra}-minute break each day"
  total = s.step(f"In {days} days that is @ minutes.", f"{daily}*{days}")
  s.step("That is @ hours.", f"{total}/60")
  return q + f". How many hours does {a.he} spend in {days} days?", s


def tank(d: Draw):
  """A tank filled at a rate, optionally with a leak: 2-3 steps."""
  a, s = d.person(), Solution()
  unit, rate = d.pick(VOLUMES), d.int(3, 20)
  q = f"{a.name}'s tank holds"
  if d.coin():
    leak = d.int(1, rate - 1)
    net = s.step(f"The tank gains @ {unit} a minute.", f"{rate}-{leak}")
    leak_text = f" A leak loses {leak} {unit} per minute."
  else:
    net, leak_text = rate, ""
  have, minutes = d.int(5, 200), d.int(3, 40)
  size = have + net * minutes
  room = s.step(f"It needs @ more {unit}.", f"{size}-{have}")
  s.step("Filling takes @ minutes.", f"{room}/{net}")
  return (q + f" {size} {unit} and already has {have} {unit}. A hose adds "
          f"{rate} {unit} per minute.{leak_text} How many minutes does it "
          "take to fill the tank?"), s


def basketball(d: Draw):
  """Points from twos, threes and free throws, the winning margin: 3-4."""
  a, s = d.person(), Solution()
  twos, threes, free = d.int(3, 20), d.int(1, 10), d.int(1, 12)
  p2 = s.step("Two-pointers give @ points.", f"{twos}*2")
  p3 = s.step("Three-pointers give @ points.", f"{threes}*3")
  total = s.step("The team scores @ points.", f"{p2}+{p3}+{free}")
  q = (f"{a.name}'s team makes {twos} two-point shots, {threes} three-point "
       f"shots and {free} free throws of 1 point.")
  if d.coin():
    other = d.int(max(1, total - 40), total - 1)
    s.step("They win by @ points.", f"{total}-{other}")
    return q + f" The other team scores {other}. By how many points do " \
        f"they win?", s
  return q + " How many points does the team score?", s
