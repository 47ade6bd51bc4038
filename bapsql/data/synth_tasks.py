"""Question templates of the embedded benchmark: each turns a table spec plus values drawn from the built database
into a `Draft` (question, gold SQL, naive SQL, evidence hint, template name).

Contract: templates only *propose*; `bapsql.data.demo` executes every gold query read-only, types its answer,
rejects drafts whose result is empty, flagged (ties, too large) or duplicated, and measures costs. Values are drawn
with the given numpy Generator from the data (via `DbView`, a plain read-only connection running trusted SQL), so
the same database and seed give the same drafts. Columns with dirty values are compared through
``LOWER(TRIM(col))`` and get an evidence hint; coded columns are asked about by their label and the evidence hint
gives the code (BIRD style, e.g. "'premium' refers to tier = 'P'").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bapsql.data.synth_values import (MONTHS, ROUND_NOTE, DbView, agg_for, cols_of, dirty_hint, expr, filter_for,
                                      fk_for, join_sql, label_col, lit, named_fks, nice, pick)


@dataclass(frozen=True)
class Draft:
    """A proposed task before its gold query has been executed."""

    question: str
    gold_sql: str
    naive_sql: str
    evidence: str
    template: str
    tags: tuple[str, ...] = ()


def t_count_filter(db, t, rng):
    f = filter_for(db, t, rng)
    if f is None:
        return None
    cond, phrase, ev, tags, _ = f
    q = pick(rng, ("How many {p} are there?", "Count the {p}.", "What is the number of {p}?")).format(p=phrase)
    return Draft(q, f"SELECT COUNT(*) FROM {t.name} WHERE {cond}", f"SELECT * FROM {t.name} WHERE {cond}", ev,
                 "count_filter", tags)


def t_count_range(db, t, rng):
    cols = cols_of(t, "int", "float")
    if not cols:
        return None
    c = pick(rng, cols)
    x = nice(db.quantile(t, c, pick(rng, (0.5, 0.8, 0.9, 0.97, 0.995))))
    q = f"How many {t.plural} have a {c.noun} greater than {x}?"
    cond = f"{c.name} > {x}"
    f = filter_for(db, t, rng) if rng.random() < 0.5 else None
    if f is not None:
        q = f"How many {f[1]} have a {c.noun} greater than {x}?"
        cond = f"{f[0]} AND {cond}"
    ev, tags = (f[2], f[3]) if f else ("", ())
    return Draft(q, f"SELECT COUNT(*) FROM {t.name} WHERE {cond}", f"SELECT * FROM {t.name} WHERE {cond}", ev,
                 "count_range", tags)


def t_agg_filter(db, t, rng):
    cols, f = cols_of(t, "int", "float"), filter_for(db, t, rng)
    if not cols or f is None:
        return None
    c = pick(rng, cols)
    sql, word, rounded = agg_for(rng, c)
    q = f"What is the {word} {c.noun} of {f[1]}?" + (ROUND_NOTE if rounded else "")
    return Draft(q, f"SELECT {sql.format(col=c.name)} FROM {t.name} WHERE {f[0]}",
                 f"SELECT {c.name} FROM {t.name} WHERE {f[0]}", f[2], "agg_filter", f[3])


def t_agg_all(db, t, rng):
    cols = cols_of(t, "int", "float")
    if not cols:
        return None
    c = pick(rng, cols)
    sql, word, rounded = agg_for(rng, c)
    q = f"What is the {word} {c.noun} over all {t.plural}?" + (ROUND_NOTE if rounded else "")
    return Draft(q, f"SELECT {sql.format(col=c.name)} FROM {t.name}", f"SELECT {c.name} FROM {t.name}", "",
                 "agg_all")


def t_argmax_count(db, t, rng):
    cols = [c for c in cols_of(t, "cat") if not c.na and not c.nulls]
    if not cols:
        return None
    c = pick(rng, cols)
    e = expr(c)
    q = f"Which {c.noun} is the most common among {t.plural}?"
    return Draft(q, f"SELECT {e} FROM {t.name} GROUP BY {e} ORDER BY COUNT(*) DESC LIMIT 1",
                 f"SELECT {c.name} FROM {t.name}", dirty_hint(t, c) if c.dirty else "", "argmax_count",
                 ("dirty",) if c.dirty else ())


def t_argmax_avg(db, t, rng):
    cats, nums = [c for c in cols_of(t, "cat") if not c.na and not c.nulls], cols_of(t, "int", "float")
    if not cats or not nums:
        return None
    c, x = pick(rng, cats), pick(rng, nums)
    e = expr(c)
    best = pick(rng, (("highest", "DESC"), ("lowest", "ASC")))
    q = f"Which {c.noun} has the {best[0]} average {x.noun} among {t.plural}?"
    return Draft(q, f"SELECT {e} FROM {t.name} GROUP BY {e} ORDER BY AVG({x.name}) {best[1]} LIMIT 1",
                 f"SELECT {c.name}, {x.name} FROM {t.name}", dirty_hint(t, c) if c.dirty else "", "argmax_avg",
                 ("dirty",) if c.dirty else ())


def t_topk(db, t, rng):
    nums = cols_of(t, "int", "float")
    if not nums:
        return None
    x, label, k = pick(rng, nums), label_col(db, t), int(pick(rng, (3, 5, 5, 10)))
    best = pick(rng, (("highest", "DESC"), ("lowest", "ASC")))
    f = filter_for(db, t, rng) if rng.random() < 0.4 else None
    subject, cond = (f[1], f" AND {f[0]}") if f else (t.plural, "")
    both = rng.random() < 0.3
    what = f"{label.noun}s and {x.noun}s" if both else f"{label.noun}s"
    proj = f"{label.name}, {x.name}" if both else label.name
    q = f"List the {what} of the {k} {subject} with the {best[0]} {x.noun}, from {best[0]} to " \
        f"{'lowest' if best[1] == 'DESC' else 'highest'}."
    gold = f"SELECT {proj} FROM {t.name} WHERE {x.name} IS NOT NULL{cond} ORDER BY {x.name} {best[1]} LIMIT {k}"
    naive = f"SELECT {label.name}, {x.name} FROM {t.name} WHERE {x.name} IS NOT NULL{cond}"
    return Draft(q, gold, naive, f[2] if f else "", "topk", f[3] if f else ())


def _list_above(db, t, rng, *, min_rows: int, high, give: str, template: str):
    """The labels of the filtered rows whose value lies above a threshold that about ``target`` of them pass, with
    ``target`` drawn from ``range(*high(n))`` for ``n`` filtered rows (at least ``min_rows``)."""
    nums, f = cols_of(t, "int", "float"), filter_for(db, t, rng)
    if not nums or f is None:
        return None
    x, label = pick(rng, nums), label_col(db, t)
    n = db.rows(f"SELECT COUNT(*) FROM {t.name} WHERE {f[0]} AND {x.name} IS NOT NULL")[0][0]
    if n < min_rows:
        return None
    target = int(rng.integers(*high(n)))
    thr = db.rows(f"SELECT {x.name} FROM {t.name} WHERE {f[0]} AND {x.name} IS NOT NULL ORDER BY {x.name} DESC "
                  f"LIMIT 1 OFFSET {min(target, n - 1)}")[0][0]
    q = f"Which {f[1]} have a {x.noun} above {thr}? Give {give} {label.noun}s."
    return Draft(q, f"SELECT {label.name} FROM {t.name} WHERE {f[0]} AND {x.name} > {thr}",
                 f"SELECT * FROM {t.name} WHERE {f[0]}", f[2], template, f[3])


def t_list_filter(db, t, rng):
    return _list_above(db, t, rng, min_rows=3, high=lambda n: (2, 9), give="their", template="list_filter")


def t_ordered_distinct(db, t, rng):
    cats, nums = cols_of(t, "cat"), cols_of(t, "int", "float")
    if not cats or not nums:
        return None
    c, x = pick(rng, cats), pick(rng, nums)
    thr = nice(db.quantile(t, x, pick(rng, (0.9, 0.99, 0.999))))
    e = expr(c)
    q = f"In alphabetical order, list the distinct {c.noun} values of {t.plural} with a {x.noun} above {thr}."
    na = f" AND {c.name} <> 'N/A'" if c.na else ""
    return Draft(q, f"SELECT DISTINCT {e} FROM {t.name} WHERE {x.name} > {thr} AND {c.name} IS NOT NULL{na} "
                    f"ORDER BY {e}", f"SELECT {c.name} FROM {t.name} WHERE {x.name} > {thr}",
                 dirty_hint(t, c) if c.dirty else "", "ordered_distinct", ("dirty",) if c.dirty else ())


def t_join_count(db, t, rng):
    fk = fk_for(db, t, rng, few=0.5)
    if fk is None:
        return None
    c, parent, name = fk
    where = f"{parent.name}.{parent.name_col.name} = {lit(name)}"
    q = pick(rng, ("How many {p} have the {n} '{v}'?", "Count the {p} whose {n} is '{v}'.")).format(
        p=t.plural, n=c.noun, v=name)
    return Draft(q, f"SELECT COUNT(*) FROM {join_sql(t, c, parent)} WHERE {where}",
                 f"SELECT {t.name}.id FROM {join_sql(t, c, parent)} WHERE {where}", "", "join_count", ("join",))


def t_join_agg(db, t, rng):
    fk, nums = fk_for(db, t, rng, few=0.5), cols_of(t, "int", "float")
    if fk is None or not nums:
        return None
    (c, parent, name), x = fk, pick(rng, nums)
    sql, word, rounded = agg_for(rng, x)
    where = f"{parent.name}.{parent.name_col.name} = {lit(name)}"
    q = f"What is the {word} {x.noun} of {t.plural} whose {c.noun} is '{name}'?" + (ROUND_NOTE if rounded else "")
    return Draft(q, f"SELECT {sql.format(col=f'{t.name}.{x.name}')} FROM {join_sql(t, c, parent)} WHERE {where}",
                 f"SELECT {t.name}.{x.name} FROM {join_sql(t, c, parent)} WHERE {where}", "", "join_agg", ("join",))


def t_join_argmax(db, t, rng):
    fks = named_fks(db, t)
    if not fks:
        return None
    c = pick(rng, fks)
    parent = db.domain.table(c.ref)
    pn = f"{parent.name}.{parent.name_col.name}"
    q = f"Which {c.noun} has the most {t.plural}? Give its {parent.name_col.noun}."
    return Draft(q, f"SELECT {pn} FROM {join_sql(t, c, parent)} GROUP BY {parent.name}.id ORDER BY COUNT(*) DESC "
                    f"LIMIT 1", f"SELECT {pn} FROM {join_sql(t, c, parent)}", "", "join_argmax", ("join",))


def t_join_having(db, t, rng):
    fks = named_fks(db, t)
    if not fks:
        return None
    c = pick(rng, fks)
    parent = db.domain.table(c.ref)
    counts = db.rows(f"SELECT COUNT(*) FROM {t.name} GROUP BY {c.name} ORDER BY 1 DESC LIMIT 12")
    if len(counts) < 4:
        return None
    thr = counts[int(rng.integers(2, len(counts)))][0]
    pn = f"{parent.name}.{parent.name_col.name}"
    q = f"Which {parent.plural} are the {c.noun} of more than {thr} {t.plural}? Give their {parent.name_col.noun}s."
    return Draft(q, f"SELECT {pn} FROM {join_sql(t, c, parent)} GROUP BY {parent.name}.id HAVING COUNT(*) > {thr}",
                 f"SELECT {pn}, {t.name}.id FROM {join_sql(t, c, parent)}", "", "join_having", ("join",))


def t_ratio(db, t, rng):
    f = filter_for(db, t, rng)
    if f is None:
        return None
    q = f"What percentage of all {t.plural} are {f[1]}?{ROUND_NOTE}"
    gold = f"SELECT ROUND(100.0 * SUM(CASE WHEN {f[0]} THEN 1 ELSE 0 END) / COUNT(*), 2) FROM {t.name}"
    cols = ", ".join(c.name for c in cols_of(t, "cat", "code"))
    return Draft(q, gold, f"SELECT {cols} FROM {t.name}", f[2], "ratio", f[3])


def t_null_count(db, t, rng):
    cols = [c for c in t.cols if (c.nulls or c.na) and c.kind != "pk"]
    if not cols:
        return None
    c = pick(rng, cols)
    cond = f"{c.name} IS NULL" + (f" OR {c.name} = 'N/A'" if c.na else "")
    ev = f"A {c.noun} of 'N/A' means it is missing." if c.na else ""
    q = f"How many {t.plural} have no recorded {c.noun}?"
    return Draft(q, f"SELECT COUNT(*) FROM {t.name} WHERE {cond}", f"SELECT * FROM {t.name} WHERE {cond}", ev,
                 "null_count", ("evidence",) if c.na else ())


def t_date_count(db, t, rng):
    cols = cols_of(t, "date")
    if not cols:
        return None
    c = pick(rng, cols)
    lo, hi = db.rows(f"SELECT MIN({c.name}), MAX({c.name}) FROM {t.name}")[0]
    year = int(rng.integers(int(lo[:4]), int(hi[:4]) + 1))
    month, u = int(rng.integers(1, 13)), rng.random()
    if u < 0.4:
        day = int(rng.integers(1, 29))
        cond, when = f"{c.name} = '{year}-{month:02d}-{day:02d}'", f"on {MONTHS[month - 1]} {day}, {year}"
    elif u < 0.7:
        cond, when = f"{c.name} LIKE '{year}-{month:02d}-%'", f"in {MONTHS[month - 1]} {year}"
    else:
        cond, when = f"{c.name} BETWEEN '{year}-01-01' AND '{year}-12-31'", f"in {year}"
    q = f"How many {t.plural} have a {c.noun} {when}?"
    return Draft(q, f"SELECT COUNT(*) FROM {t.name} WHERE {cond}", f"SELECT * FROM {t.name} WHERE {cond}", "",
                 "date_count")


def t_lookup(db, t, rng):
    nums = [c for c in cols_of(t, "int", "float", "date") if not c.nulls] + [
        c for c in cols_of(t, "cat") if not c.dirty and not c.na]
    names = db.unique_names(t, rng)
    if not nums or not names:
        return None
    x, name = pick(rng, nums), names[0]
    q = f"What is the {x.noun} of the {t.noun} named '{name}'?"
    nc = t.name_col.name
    return Draft(q, f"SELECT {x.name} FROM {t.name} WHERE {nc} = {lit(name)}",
                 f"SELECT * FROM {t.name} WHERE {nc} = {lit(name)}", "", "lookup")


def t_count_distinct(db, t, rng):
    fks, f = cols_of(t, "fk"), filter_for(db, t, rng)
    if not fks or f is None:
        return None
    c = pick(rng, fks)
    q = f"How many different {c.noun}s appear among {f[1]}?"
    return Draft(q, f"SELECT COUNT(DISTINCT {c.name}) FROM {t.name} WHERE {f[0]}",
                 f"SELECT {c.name} FROM {t.name} WHERE {f[0]}", f[2], "count_distinct", f[3])


def t_entity_list(db, t, rng):
    fk = fk_for(db, t, rng, few=0.5)
    cols = [c for c in cols_of(t, "int", "float", "date", "cat") if not c.dirty and not c.na]
    if fk is None or not cols:
        return None
    (c, parent, name), x = fk, pick(rng, cols)
    where = f"{parent.name}.{parent.name_col.name} = {lit(name)}"
    q = f"List the {x.noun} of every {t.noun} whose {c.noun} is '{name}'."
    return Draft(q, f"SELECT {t.name}.{x.name} FROM {join_sql(t, c, parent)} WHERE {where}",
                 f"SELECT {t.name}.* FROM {join_sql(t, c, parent)} WHERE {where}", "", "entity_list", ("join",))


def t_entity_latest(db, t, rng):
    fk, dates = fk_for(db, t, rng, few=0.5), cols_of(t, "date")
    if fk is None or not dates:
        return None
    (c, parent, name), d = fk, pick(rng, dates)
    where = f"{parent.name}.{parent.name_col.name} = {lit(name)}"
    fn, word = pick(rng, (("MAX", "most recent"), ("MIN", "earliest")))
    q = f"What is the {word} {d.noun} among {t.plural} whose {c.noun} is '{name}'?"
    return Draft(q, f"SELECT {fn}({t.name}.{d.name}) FROM {join_sql(t, c, parent)} WHERE {where}",
                 f"SELECT {t.name}.{d.name} FROM {join_sql(t, c, parent)} WHERE {where}", "", "entity_latest",
                 ("join",))


def t_entity_parent(db, t, rng):
    fks, names = named_fks(db, t), db.unique_names(t, rng)
    if not fks or not names:
        return None
    c, name = pick(rng, fks), names[0]
    parent = db.domain.table(c.ref)
    q = f"What is the {c.noun} of the {t.noun} named '{name}'? Give its {parent.name_col.noun}."
    return Draft(q, f"SELECT {parent.name}.{parent.name_col.name} FROM {join_sql(t, c, parent)} "
                    f"WHERE {t.name}.{t.name_col.name} = {lit(name)}",
                 f"SELECT * FROM {t.name} WHERE {t.name_col.name} = {lit(name)}", "", "entity_parent", ("join",))


def t_entity_count_filter(db, t, rng):
    fk, f = fk_for(db, t, rng, few=0.5), filter_for(db, t, rng, table_prefix=f"{t.name}.")
    if fk is None or f is None:
        return None
    c, parent, name = fk
    where = f"{parent.name}.{parent.name_col.name} = {lit(name)}"
    q = f"Among {t.plural} whose {c.noun} is '{name}', how many are {f[1]}?"
    return Draft(q, f"SELECT COUNT(*) FROM {join_sql(t, c, parent)} WHERE {where} AND {f[0]}",
                 f"SELECT {t.name}.{f[4]} FROM {join_sql(t, c, parent)} WHERE {where}", f[2], "entity_count_filter",
                 ("join",) + f[3])


def t_lookup_pair(db, t, rng):
    cols = [c for c in cols_of(t, "int", "float", "date", "cat", "code") if not c.dirty and not c.na and not c.nulls]
    names = db.unique_names(t, rng)
    if len(cols) < 2 or not names:
        return None
    i, j = sorted(rng.choice(len(cols), size=2, replace=False).tolist())
    a, b, name = cols[i], cols[j], names[0]
    nc = t.name_col.name
    q = f"What are the {a.noun} and the {b.noun} of the {t.noun} named '{name}'?"
    return Draft(q, f"SELECT {a.name}, {b.name} FROM {t.name} WHERE {nc} = {lit(name)}",
                 f"SELECT * FROM {t.name} WHERE {nc} = {lit(name)}", "", "lookup_pair")


def t_topk_long(db, t, rng):
    """A long ranked list (12-20 labels): the gold result outgrows XS's result tokens; the broad draft (every row,
    every column) outgrows S's."""
    nums = cols_of(t, "int", "float")
    if not nums:
        return None
    x, label, k = pick(rng, nums), label_col(db, t), int(pick(rng, (12, 15, 20)))
    best = pick(rng, (("highest", "DESC"), ("lowest", "ASC")))
    q = f"List the {label.noun}s of the {k} {t.plural} with the {best[0]} {x.noun}, from {best[0]} to " \
        f"{'lowest' if best[1] == 'DESC' else 'highest'}."
    gold = f"SELECT {label.name} FROM {t.name} WHERE {x.name} IS NOT NULL ORDER BY {x.name} {best[1]} LIMIT {k}"
    return Draft(q, gold, f"SELECT * FROM {t.name} WHERE {x.name} IS NOT NULL", "", "topk_long")


def t_list_long(db, t, rng):
    """A long filtered list (12-19 rows above a threshold): as `t_topk_long`, unordered."""
    return _list_above(db, t, rng, min_rows=14, high=lambda n: (12, min(20, n)), give="all their",
                       template="list_long")

TEMPLATES: dict[str, Callable] = {
    "count_filter": t_count_filter, "count_range": t_count_range, "agg_filter": t_agg_filter, "agg_all": t_agg_all,
    "argmax_count": t_argmax_count, "argmax_avg": t_argmax_avg, "topk": t_topk, "list_filter": t_list_filter,
    "ordered_distinct": t_ordered_distinct, "join_count": t_join_count, "join_agg": t_join_agg,
    "join_argmax": t_join_argmax, "join_having": t_join_having, "ratio": t_ratio, "null_count": t_null_count,
    "date_count": t_date_count, "lookup": t_lookup, "count_distinct": t_count_distinct,
    "entity_list": t_entity_list, "entity_latest": t_entity_latest, "entity_parent": t_entity_parent,
    "entity_count_filter": t_entity_count_filter, "lookup_pair": t_lookup_pair,
    "topk_long": t_topk_long, "list_long": t_list_long,  # the binding mix's (`bapsql.data.mixes`)
}


def propose(db: DbView, rng: np.random.Generator, attempts: dict[str, int]) -> list[Draft]:
    """Drafts for every (template, table) pair, ``attempts[template]`` tries each (None results are skipped)."""
    out = []
    for name, fn in TEMPLATES.items():
        for t in db.domain.tables:
            for _ in range(attempts.get(name, 0)):
                d = fn(db, t, rng)
                if d is not None:
                    out.append(d)
    return out
