"""Problem templates about money: shopping, savings, wages, discounts, sales,
party tickets, selling a harvest. Each returns (question, Solution)."""

from __future__ import annotations

from flash_dllm_data.gsm_format import Solution
from flash_dllm_data.problem_kit import FRUITS, STORE_ITEMS, Draw


def _cap(text: str) -> str:
  return text[:1].upper() + text[1:]


def shopping(d: Draw):
  """2-3 item costs, their sum, optionally the change: 3-5 steps."""
  a, s = d.person(), Solution()
  k = 3 if d.coin(0.4) else 2
  items = d.rng.sample(STORE_ITEMS, k)
  n = [d.int(2, 12) for _ in range(k)]
  p = [d.int(2, 25) for _ in range(k)]
  bought = " and ".join(f"{n[i]} {items[i]} for ${p[i]} each" for i in range(k))
  costs = [s.step(f"The {items[i]} cost @.", f"{n[i]}*{p[i]}", True)
           for i in range(k)]
  total = s.step(f"{a.name} spends @ in total.", "+".join(map(str, costs)),
                 True)
  q = f"{a.name} buys {bought}."
  if d.coin():
    bill = (total // 50 + 1) * 50 + d.pick((0, 50))
    s.step(f"{_cap(a.he)} gets back @.", f"{bill}-{total}", True)
    return q + f" {_cap(a.he)} pays with ${bill}. How much change does " \
        f"{a.he} get?", s
  return q + f" How much money does {a.name} spend?", s


def savings(d: Draw):
  """Weekly savings minus a purchase, optionally plus a gift: 2-3 steps."""
  a, s = d.person(), Solution()
  weeks, amount, cost = d.int(3, 20), d.int(5, 40), d.int(10, 150)
  thing = d.pick(("a bike lamp", "a video game", "a jacket", "a backpack"))
  saved = s.step(f"{a.name} saves @ in total.", f"{amount}*{weeks}", True)
  left = s.step(f"After buying {thing}, {a.he} has @ left.",
                f"{saved}-{cost}", True)
  q = (f"{a.name} saves ${amount} every week for {weeks} weeks. Then {a.he} "
       f"spends ${cost} on {thing}.")
  if d.coin():
    gift = d.int(5, 60)
    s.step(f"With the gift {a.he} has @.", f"{left}+{gift}", True)
    q += f" {_cap(a.his)} aunt gives {a.him} ${gift}."
  return q + f" How much money does {a.name} have now?", s


def wages(d: Draw):
  """Daily and total pay, optional overtime and rent: 2-5 steps."""
  a, s = d.person(), Solution()
  rate, hours, days = d.int(8, 30), d.int(2, 9), d.int(2, 6)
  daily = s.step(f"{a.name} earns @ a day.", f"{rate}*{hours}", True)
  pay = s.step(f"In {days} days {a.he} earns @.", f"{daily}*{days}", True)
  q = (f"{a.name} earns ${rate} per hour. {_cap(a.he)} works {hours} hours a "
       f"day for {days} days.")
  if d.coin():
    extra, bonus = d.int(2, 10), rate + d.int(2, 10)
    over = s.step("The overtime pays @.", f"{extra}*{bonus}", True)
    pay = s.step(f"{_cap(a.he)} earns @ in total.", f"{pay}+{over}", True)
    q += (f" {_cap(a.he)} also works {extra} hours of overtime at ${bonus} "
          "per hour.")
  if d.coin(0.4):
    rent = d.int(20, 200)
    s.step(f"After paying rent {a.he} keeps @.", f"{pay}-{rent}", True)
    return q + f" {_cap(a.he)} pays ${rent} for rent. How much money does " \
        f"{a.he} keep?", s
  return q + f" How much does {a.name} earn?", s


def discount(d: Draw):
  """Percent off, sale price, several items, optional change: 3-4 steps."""
  a, s = d.person(), Solution()
  item = d.pick(("jacket", "lamp", "backpack", "board game", "pair of shoes"))
  pct = d.pick((10, 20, 25, 30, 40, 50))
  price = d.int(2, 30) * (100 // {10: 10, 20: 5, 25: 4, 30: 10, 40: 5,
                                  50: 2}[pct])
  n = d.int(2, 5)
  off = s.step("The discount is @.", f"{price}*{pct}/100", True)
  each = s.step("The sale price is @.", f"{price}-{off}", True)
  total = s.step(f"{a.name} pays @ for {n}.", f"{n}*{each}", True)
  q = (f"A {item} costs ${price}. The store gives {pct}% off. "
       f"{a.name} buys {n} of them at the sale price.")
  if d.coin(0.4):
    bill = (total // 100 + 1) * 100
    s.step(f"{_cap(a.he)} gets @ back.", f"{bill}-{total}", True)
    return q + f" {_cap(a.he)} pays with ${bill}. How much change does " \
        f"{a.he} get?", s
  return q + f" How much does {a.name} pay?", s


def sales(d: Draw):
  """Three days of sales, then revenue or profit: 3-5 steps."""
  a, s = d.person(), Solution()
  item = d.pick(("cups of lemonade", "bracelets", "comic books", "candles"))
  mon, more = d.int(5, 60), d.int(2, 30)
  tue = s.step("On Tuesday @ were sold.", f"{mon}+{more}")
  wed = s.step("On Wednesday @ were sold.", f"{tue}*2")
  total = s.step("In the three days @ were sold.", f"{mon}+{tue}+{wed}")
  q = (f"{a.name} sells {mon} {item} on Monday. On Tuesday {a.he} sells "
       f"{more} more than on Monday, and on Wednesday twice as many as on "
       "Tuesday.")
  if d.coin(0.3):
    return q + f" How many {item} does {a.he} sell in the three days?", s
  price = d.int(3, 12)
  if d.coin():
    s.step(f"{_cap(a.he)} makes @.", f"{total}*{price}", True)
    return q + f" Each costs ${price}. How much money does {a.he} make?", s
  cost = d.int(1, price - 1)
  gain = s.step("The profit on each is @.", f"{price}-{cost}", True)
  s.step(f"{_cap(a.he)} makes a profit of @.", f"{total}*{gain}", True)
  return q + (f" Each sells for ${price} and costs {a.him} ${cost} to "
              f"make. What is {a.his} total profit?"), s


def party(d: Draw):
  """Tickets for adults and children plus snacks, split equally: 4-5 steps."""
  a, s = d.person(), Solution()
  adults, kids, k = d.int(2, 6), d.int(2, 8), d.int(2, 5)
  pa, pc = d.int(8, 30), d.int(3, 15)
  ca = s.step("The adult tickets cost @.", f"{adults}*{pa}", True)
  cc = s.step("The child tickets cost @.", f"{kids}*{pc}", True)
  q = (f"{a.name} takes {adults} adults and {kids} children to the "
       f"{d.pick(('zoo', 'museum', 'cinema', 'aquarium'))}. Adult tickets "
       f"cost ${pa} and child tickets cost ${pc}.")
  if d.coin():
    snacks = d.int(10, 60)
    total = s.step("Everything costs @.", f"{ca}+{cc}+{snacks}", True)
    q += f" Snacks cost ${snacks}."
  else:
    total = s.step("The tickets cost @.", f"{ca}+{cc}", True)
  s.step("Each one pays @.", f"{total}/{k}", True)
  return q + (f" {a.name} and {k - 1} friends share the cost equally. How "
              "much does each of them pay?"), s


def garden(d: Draw):
  """Plants, harvest, bags sold, optional costs: 4-6 steps."""
  a, s = d.person(), Solution()
  crop = d.pick(("tomatoes", "peppers", "cucumbers") + FRUITS[:2])
  rows, per_row, each = d.int(2, 8), d.int(3, 12), d.int(4, 20)
  bag, price = d.pick((4, 5, 6, 10)), d.int(2, 9)
  plants = s.step("There are @ plants.", f"{rows}*{per_row}")
  crop_n = s.step(f"They grow @ {crop}.", f"{plants}*{each}")
  q = (f"{a.name} has {rows} rows of plants with {per_row} plants in each "
       f"row. Each plant grows {each} {crop}.")
  if d.coin():
    eaten = d.int(2, 30)
    crop_n = s.step(f"{a.name} sells @ {crop}.", f"{crop_n}-{eaten}")
    q += f" {a.name} keeps {eaten} {crop} and sells the rest"
  else:
    q += f" {a.name} sells all of them"
  bags = s.step("That fills @ bags.", f"{crop_n}/{bag}")
  money = s.step("The bags sell for @.", f"{bags}*{price}", True)
  q += f" in bags of {bag} for ${price} a bag."
  if d.coin(0.4):
    seeds = d.int(5, max(6, money - 1))
    s.step(f"{_cap(a.his)} profit is @.", f"{money}-{seeds}", True)
    return q + f" Seeds and soil cost ${seeds}. What is {a.his} profit?", s
  return q + f" How much money does {a.name} make?", s
