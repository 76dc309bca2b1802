"""sqlite-query: a small shop database (customers, products, orders) is built in setup with the
sqlite3 CLI; answer one question about it (a count, a sum, a top-1 name, an anti-join) with SQL
and write the answer to a file. Expected answers are computed in Python at generation time."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import CITIES, person, py_verify, unique_words
from obsspec.env.task import Task

NAME = "sqlite-query"

CATEGORIES = ["books", "garden", "kitchen", "toys", "tools", "music"]


def _data(rng: random.Random):
    cities = rng.sample(CITIES, rng.randint(3, 5))
    names: list[str] = []
    n_customers = rng.randint(8, 14)
    while len(names) < n_customers:
        p = person(rng)
        names += [p] if p not in names else []
    customers = [(i + 1, n, rng.choice(cities)) for i, n in enumerate(names)]
    cats = rng.sample(CATEGORIES, rng.randint(3, 4))
    products = [(i + 1, w.title(), rng.choice(cats), rng.randint(199, 9999))  # price in cents
                for i, w in enumerate(unique_words(rng, rng.randint(6, 10)))]
    buyers = customers[: len(customers) - rng.randint(1, 3)]  # the last few never order
    orders = [(i + 1, rng.choice(buyers)[0], rng.choice(products)[0], rng.randint(1, 5),
               f"2024-{rng.randint(1, 6):02d}-{rng.randint(1, 28):02d}") for i in range(rng.randint(20, 45))]
    return customers, products, orders


def _tied(totals: dict[str, int]) -> bool:
    best = sorted(totals.values(), reverse=True)
    return len(best) < 2 or best[0] == best[1]


def generate(rng: random.Random, task_id: str) -> Task:
    while True:  # retry until the chosen question has a unique answer
        customers, products, orders = _data(rng)
        cust, prod = {c[0]: c for c in customers}, {p[0]: p for p in products}
        q = rng.choice(["city_orders", "cat_units", "top_spender", "no_orders", "month_revenue", "top_product"])
        city, cat = rng.choice(customers)[2], rng.choice(products)[2]
        month = rng.choice(sorted({o[4][:7] for o in orders}))
        spent: dict[str, int] = {}
        units: dict[str, int] = {}
        for _, c, p, qty, _ in orders:
            spent[cust[c][1]] = spent.get(cust[c][1], 0) + qty * prod[p][3]
            units[prod[p][1]] = units.get(prod[p][1], 0) + qty
        if not (q == "top_spender" and _tied(spent) or q == "top_product" and _tied(units)):
            break
    questions = {
        "city_orders": (f"How many orders were placed by customers who live in {city}?",
                        sum(cust[o[1]][2] == city for o in orders),
                        "SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
                        f"WHERE c.city = '{city}';"),
        "cat_units": (f"How many units (sum of quantity) of products in the category '{cat}' were ordered in total?",
                      sum(o[3] for o in orders if prod[o[2]][2] == cat),
                      "SELECT COALESCE(SUM(o.quantity), 0) FROM orders o JOIN products p ON p.id = o.product_id "
                      f"WHERE p.category = '{cat}';"),
        "top_spender": ("Which customer spent the most money in total (quantity * price over all their orders)? "
                        "Give the customer's name.", max(spent, key=spent.get),
                        "SELECT c.name FROM orders o JOIN customers c ON c.id = o.customer_id JOIN products p "
                        "ON p.id = o.product_id GROUP BY c.id ORDER BY SUM(o.quantity * p.price) DESC LIMIT 1;"),
        "no_orders": ("How many customers have never placed an order?",
                      len(customers) - len({o[1] for o in orders}),
                      "SELECT COUNT(*) FROM customers WHERE id NOT IN (SELECT customer_id FROM orders);"),
        "month_revenue": (f"What was the total revenue (quantity * price) of orders placed in {month} (order_date "
                          "is YYYY-MM-DD)? Give the amount rounded to 2 decimals.",
                          f"{sum(o[3] * prod[o[2]][3] for o in orders if o[4].startswith(month)) / 100:.2f}",
                          "SELECT printf('%.2f', SUM(o.quantity * p.price)) FROM orders o JOIN products p ON "
                          f"p.id = o.product_id WHERE o.order_date LIKE '{month}-%';"),
        "top_product": ("Which product sold the most units (sum of quantity)? Give the product's name.",
                        max(units, key=units.get),
                        "SELECT p.name FROM orders o JOIN products p ON p.id = o.product_id GROUP BY p.id "
                        "ORDER BY SUM(o.quantity) DESC LIMIT 1;"),
    }
    question, answer, sql = questions[q]
    db = rng.choice(["shop.db", "store.db", "sales.db", "data/shop.sqlite"])
    out = rng.choice(["answer.txt", "result.txt"])
    schema = ("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT);\n"
              "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT, price REAL);\n"
              "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
              "product_id INTEGER REFERENCES products(id), quantity INTEGER, order_date TEXT);\n")
    rows = [f"INSERT INTO customers VALUES ({i}, '{n}', '{c}');" for i, n, c in customers]
    rows += [f"INSERT INTO products VALUES ({i}, '{n}', '{c}', {p / 100:.2f});" for i, n, c, p in products]
    rows += [f"INSERT INTO orders VALUES ({i}, {c}, {p}, {qty}, '{d}');" for i, c, p, qty, d in orders]
    mk = f"mkdir -p {db.rsplit('/', 1)[0]} && " if "/" in db else ""
    check = f"lines = read_lines({out!r})\nok = lines[:1] == [{str(answer)!r}]\n"
    if q == "month_revenue":  # a number: 1234.5 and 1234.50 are both fine
        check = (f"lines = read_lines({out!r})\ntry:\n    ok = abs(float(lines[0]) - {float(answer)!r}) < 0.006\n"
                 "except (IndexError, ValueError):\n    ok = False\n")
    check += "if not ok:\n    fail('wrong answer %r' % lines)"
    return Task(
        task_id=task_id, family=NAME,
        instruction=f"The SQLite database /app/{db} holds a small shop's customers, products and orders. {question} "
                    f"Write only the answer to /app/{out}.",
        files={".seed.sql": schema + "BEGIN;\n" + "\n".join(rows) + "\nCOMMIT;\n"},
        setup=f"{mk}sqlite3 {db} < .seed.sql && rm .seed.sql\n",
        verify=py_verify(check),
        solution=[f"sqlite3 {db} .schema", f"sqlite3 {db} 'SELECT * FROM orders LIMIT 5;'",
                  f'sqlite3 {db} "{sql}" > {out}', f"cat {out}"],
    )
